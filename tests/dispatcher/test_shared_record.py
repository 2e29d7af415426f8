"""Shared records (the dispatcher's state board, the engines' heartbeats) are read whole or not at all.

A writer process and a reader on the same mapping, as the dispatcher and its front ends are: every
record the reader gets is one the writer wrote. With `struct.pack_into` straight onto the mapping
(before windve/shared_record.py) such a reader saw 0.0 stamps thousands of times in a few seconds.
"""

from __future__ import annotations

import math
import mmap
import multiprocessing
import os
import struct
import time

import pytest

from windve.dispatcher.board import OK, StateBoard
from windve.heartbeat import HeartbeatBoard
from windve.shared_record import SharedRecord, TornRead

LAYOUT = struct.Struct("<qqd")  # i, 3*i, float(i): a record is whole when the three agree
WRITES = 100_000
PACE = 20e-6  # seconds between writes


def _write_many(fd: int, done) -> None:
    record = SharedRecord(mmap.mmap(fd, SharedRecord.size(LAYOUT)), LAYOUT)
    for i in range(1, WRITES + 1):
        record.write(i, 3 * i, float(i))
        # Far faster than any writer of the service (the board: every 5 ms), but with a gap between
        # writes: a writer that never pauses leaves a reader no whole record to read.
        paced = time.perf_counter() + PACE
        while time.perf_counter() < paced:
            pass
    done.set()


def test_a_reader_beside_a_busy_writer_gets_only_whole_records():
    fd = os.memfd_create("test-shared-record", 0)
    os.ftruncate(fd, SharedRecord.size(LAYOUT))
    record = SharedRecord(mmap.mmap(fd, SharedRecord.size(LAYOUT)), LAYOUT)
    record.write(0, 0, 0.0)
    context = multiprocessing.get_context("fork")
    done = context.Event()
    writer = context.Process(target=_write_many, args=(fd, done))
    writer.start()
    reads, torn, seen = 0, [], set()
    try:
        while not done.is_set():
            i, triple, as_float = record.read()
            reads += 1
            seen.add(i)
            if triple != 3 * i or as_float != float(i):
                torn.append((i, triple, as_float))
    finally:
        writer.join(timeout=60)
        os.close(fd)
    assert writer.exitcode == 0
    assert torn == []
    assert record.read() == (WRITES, 3 * WRITES, float(WRITES))
    if len(seen) <= 100:  # a reader the scheduler starved proves nothing either way about torn reads
        pytest.skip(f"the reader ran beside the writer for only {len(seen)} records ({reads} reads): "
                    "this machine is too loaded to race them")


def _die_mid_write(buffer) -> None:
    """What a writer killed between its two sequence numbers leaves: an odd number."""
    sequence = struct.unpack_from("<Q", buffer, 0)[0]
    buffer[0:8] = struct.pack("<Q", sequence + 1)


def test_a_writer_stopped_mid_write_leaves_readers_the_last_whole_record_and_the_next_write_repairs_it(
    tmp_path,
):
    board = StateBoard(tmp_path / "board", create=True)
    board.write(ready=True, draining=False, health=OK, free_room=5, retry_after=1.0)
    reader = StateBoard(tmp_path / "board")  # a front end's
    assert reader.read().free_room == 5
    _die_mid_write(board._map)
    # A reader that has read the board keeps its last whole record, whose stamp ages as a dead
    # dispatcher's would; one that never read a whole record finds the dispatcher gone.
    assert reader.read().free_room == 5 and reader.read().alive
    newcomer = StateBoard(tmp_path / "board")
    with pytest.raises(TornRead):
        newcomer._record.read()
    state = newcomer.read()
    assert not state.alive and state.age == math.inf and not state.ready
    board.write(ready=True, draining=False, health=OK, free_room=7, retry_after=1.0)
    assert newcomer.read().alive and newcomer.read().free_room == 7 and reader.read().free_room == 7
    for each in (board, reader, newcomer):
        each.close()

    heartbeat = HeartbeatBoard()
    _die_mid_write(heartbeat._map)
    assert heartbeat.stamp() == heartbeat.created  # silent since the board was made: the worker is gone
    reset_at = time.monotonic()  # the board's clock
    heartbeat.reset()
    assert 0.0 <= heartbeat.age() <= time.monotonic() - reset_at  # counted from the reset
    heartbeat.close()
