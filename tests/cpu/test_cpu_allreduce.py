"""The shared-memory all-reduce and batch broadcast, between real processes."""

from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest

from windve.cpu.allreduce import GroupComm, PeerTimeout, create_group_segment
from windve.cpu.layout import GroupLayout
from windve.cpu.shm import SEGMENT_PREFIX, Segment, segment_files, shm_dir, sweep_stale

SIZES = [1, 10, 1000, 2500, 7, 3001]  # the slot holds 1000: 2500 and 3001 run in chunks
LAYOUT_ELEMS = 1000


def partial(rank: int, round_index: int) -> np.ndarray:
    rng = np.random.default_rng([rank, round_index])
    return rng.standard_normal(SIZES[round_index % len(SIZES)]).astype(np.float32)


def expected_sum(world: int, round_index: int) -> np.ndarray:
    total = partial(0, round_index) + partial(1, round_index)  # the ranks' summation order
    for rank in range(2, world):
        total = total + partial(rank, round_index)
    return total


def reduce_rounds(path: str, layout: GroupLayout, rank: int, rounds: int, timeout: float) -> int:
    """Run `rounds` reduces; return how many results were wrong (0 = all exact)."""
    comm = GroupComm(path, layout, rank, timeout)
    wrong = sum(
        not np.array_equal(comm.all_reduce(partial(rank, i)), expected_sum(layout.world, i))
        for i in range(rounds)
    )
    comm.close()
    return wrong


def peer_main(path: str, layout: GroupLayout, rank: int, rounds: int, timeout: float) -> None:
    os._exit(min(reduce_rounds(path, layout, rank, rounds, timeout), 100))


def broadcast_peer_main(path: str, layout: GroupLayout, batches: int) -> None:
    """Rank 1: read each broadcast batch and hand its checksum back through a reduce."""
    comm = GroupComm(path, layout, 1, timeout=10.0)
    for _ in range(batches):
        data = comm.wait_input(lambda: True)
        comm.all_reduce(np.array([sum(bytes(data[:64]))], dtype=np.float32))
    os._exit(0)


@pytest.fixture()
def group():
    """A fresh segment (and its cleanup) per test; yields (segment, layout factory)."""
    made: list[Segment] = []

    def make(world: int) -> tuple[Segment, GroupLayout]:
        layout = GroupLayout(world=world, reduce_elems=LAYOUT_ELEMS, input_bytes=4096)
        segment = create_group_segment(layout)
        made.append(segment)
        return segment, layout

    yield make
    for segment in made:
        segment.unlink()
        segment.close()


def spawn(target, *args) -> multiprocessing.Process:
    process = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    process.start()
    return process


@pytest.mark.parametrize("world", [2, 3])
def test_sum_is_exact_and_identical_on_every_rank_over_many_rounds(group, world):
    segment, layout = group(world)
    rounds = 24
    peers = [spawn(peer_main, str(segment.path), layout, rank, rounds, 30.0) for rank in range(1, world)]
    assert reduce_rounds(str(segment.path), layout, 0, rounds, 30.0) == 0
    for peer in peers:
        peer.join(timeout=60)
        assert peer.exitcode == 0, "a peer rank saw a wrong sum"


def test_reduce_times_out_naming_the_missing_rank_when_a_peer_is_gone(group):
    segment, layout = group(2)
    peer = spawn(peer_main, str(segment.path), layout, 1, 3, 30.0)  # does 3 rounds, then exits
    comm = GroupComm(segment.path, layout, 0, timeout=30.0)  # the peer may take a while to boot
    for i in range(3):
        np.testing.assert_array_equal(comm.all_reduce(partial(0, i)), expected_sum(2, i))
    peer.join(timeout=30)
    comm.timeout = 0.5
    started = time.monotonic()
    # The message names the timeout the wait used: the lowered 0.5 s, not the 30 s it was built with.
    with pytest.raises(
        PeerTimeout, match=r"round 4 timed out after 0\.5 s waiting for rank 1 \(its last published round is 3\)"
    ):
        comm.all_reduce(partial(0, 3))
    assert time.monotonic() - started < 15.0  # did not hang: far below the 30 s it was built with
    comm.close()


def test_reduce_times_out_when_no_peer_ever_came(group):
    segment, layout = group(3)
    comm = GroupComm(segment.path, layout, 2, timeout=0.2)
    with pytest.raises(PeerTimeout, match="rank 2: all-reduce round 1"):
        comm.all_reduce(np.ones(4, np.float32))
    comm.close()


def test_broadcast_delivers_every_batch_through_the_double_buffer(group):
    segment, layout = group(2)
    batches = 6
    peer = spawn(broadcast_peer_main, str(segment.path), layout, batches)
    comm = GroupComm(segment.path, layout, 0, timeout=30.0)
    for batch in range(batches):
        payload = bytes((batch * 7 + i) % 251 for i in range(64))
        comm.next_input()[:64] = payload
        comm.publish_input()
        seen = comm.all_reduce(np.zeros(1, np.float32))
        assert seen[0] == sum(payload)
    peer.join(timeout=30)
    assert peer.exitcode == 0
    comm.close()


def test_segments_are_unlinked_and_stale_ones_swept(group):
    segment, _ = group(2)
    assert segment.path in segment_files()
    segment.unlink()
    assert segment.path not in segment_files()
    ghost = multiprocessing.get_context("spawn").Process(target=os.getpid)
    ghost.start()
    ghost.join()
    stale = shm_dir() / f"{SEGMENT_PREFIX}{ghost.pid}-deadbeef"
    stale.write_bytes(b"x")
    assert stale in sweep_stale()
    assert not stale.exists()
