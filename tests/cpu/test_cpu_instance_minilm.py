"""Pinned workers with the real MiniLM weights: G=1 and G=2 against the in-process model,
real pinning, and failure handling (a killed or stuck rank fails the batch, restart heals)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from cpu_helpers import assert_close, own_segments, reference_embeddings, token_batch

from queue_manager.protocol import Instance, InstanceFailed
from windve.engine_process.instance import EngineProcessInstance, split_threads

REDUCE_TIMEOUT = 4.0  # generous: ranks on a loaded machine must not time out by accident


@pytest.fixture(scope="module")
def g1(minilm_spec, run_async):
    instance = EngineProcessInstance(minilm_spec, name="g1", rank_cores=[[0, 1]], numa_nodes=[0])
    run_async(instance.start())
    yield instance
    run_async(instance.close())


@pytest.fixture(scope="module")
def g2(minilm_spec, run_async):
    # max_batch_tokens=64 -> 512-token input buffers and 512x384-float reduce slots: the
    # 16 x 75-token batch below is split into requests and its reduces into chunks.
    instance = EngineProcessInstance(
        minilm_spec,
        name="g2",
        rank_cores=[[0], [1]],
        numa_nodes=[0, 0],
        max_batch_tokens=64,
        reduce_timeout=REDUCE_TIMEOUT,
    )
    run_async(instance.start())
    yield instance
    run_async(instance.close())
    run_async(instance.close())  # idempotent
    assert own_segments() == []


def test_pinned_single_worker_matches_the_in_process_engine(g1, minilm_engine, run_async):
    assert isinstance(g1, Instance)
    sequences = token_batch(6, 30522, seed=1)
    assert_close(run_async(g1.embed(sequences)), reference_embeddings(minilm_engine, sequences), atol=1e-5)


def test_single_worker_pinning_is_what_the_plan_said(g1):
    info = g1.info()
    (rank,) = info["ranks"]
    assert info["tp"] == 1 and info["pids"] == g1.pids
    assert os.sched_getaffinity(g1.pids[0]) == {0, 1}
    assert rank["torch_threads"] == 2 and info["threads"] == 2
    assert rank["imported_before_pinning"] == []
    assert info["membind"] in ("bound", "preferred") or info["membind"].startswith("unavailable: ")


def test_the_planned_thread_count_is_the_ranks_not_one_per_cpu(minilm_spec, minilm_engine, run_async):
    """A plan's `threads` (one per physical core: both SMT siblings pinned, one thread) reaches the
    rank's torch and OpenMP pools; the pinning stays every CPU of its cores."""
    instance = EngineProcessInstance(minilm_spec, name="t1", rank_cores=[[0, 1]], numa_nodes=[0], threads=1)
    run_async(instance.start())
    try:
        (rank,) = instance.info()["ranks"]
        assert rank["torch_threads"] == 1 and instance.info()["threads"] == 1
        assert os.sched_getaffinity(rank["pid"]) == {0, 1}
        with open(f"/proc/{rank['pid']}/environ", "rb") as environ:
            assert b"OMP_NUM_THREADS=1" in environ.read().split(b"\0")
        sequences = token_batch(4, 30522, seed=5)
        assert_close(run_async(instance.embed(sequences)), reference_embeddings(minilm_engine, sequences), atol=1e-5)
    finally:
        run_async(instance.close())


@pytest.mark.parametrize(
    ("threads", "rank_cores", "expected"),
    [
        (None, [[0, 1], [2, 3]], [None, None]),  # one per CPU, as before a plan said otherwise
        (4, [[0, 1, 2, 3], [4, 5, 6, 7]], [2, 2]),  # a TP instance's physical cores, per node
        (3, [[0, 1, 2, 3], [4, 5]], [2, 1]),
        (1, [[0], [1]], [1, 1]),  # never none
        (1, [[]], [1]),  # an accelerator instance that names no core: one feeding thread
    ],
)
def test_an_instances_threads_split_over_its_ranks_by_their_cpus(threads, rank_cores, expected):
    assert split_threads(threads, rank_cores) == expected


def test_cpu_engines_send_a_batch_ahead_only_half_full_and_accelerators_at_once(minilm_spec):
    """No process starts: what the queue manager reads off the instance (queue_manager/pool.py)."""
    cpu = EngineProcessInstance(minilm_spec, name="c", rank_cores=[[0]], numa_nodes=[0])
    gpu = EngineProcessInstance(minilm_spec, name="a", rank_cores=[[0]], numa_nodes=[0], device="cuda:0", dtype="fp16")
    assert (cpu.pipeline, cpu.ahead_fill) == (2, 0.5)
    assert (gpu.pipeline, gpu.ahead_fill) == (2, 0.0)


def test_two_rank_tp_matches_the_unsharded_model(g2, minilm_engine, run_async):
    for sequences in (token_batch(3, 30522, seed=2), token_batch(16, 30522, lengths=[75] * 16, seed=3)):
        assert_close(run_async(g2.embed(sequences)), reference_embeddings(minilm_engine, sequences))


def test_two_rank_pinning_is_what_the_plan_said(g2):
    info = g2.info()
    assert info["tp"] == 2 and len(info["ranks"]) == 2
    for rank, cores in zip(info["ranks"], ([0], [1]), strict=True):
        assert os.sched_getaffinity(rank["pid"]) == set(cores)
        assert rank["torch_threads"] == 1
        assert rank["imported_before_pinning"] == []
    assert g2.reduce_rounds()[0] == g2.reduce_rounds()[1] > 0


async def embed_until_in_flight(instance, sequences, rank: int):
    """Start a batch and return once `rank` has published an all-reduce of it."""
    before = instance.reduce_rounds()[rank]
    task = asyncio.create_task(instance.embed(sequences))
    deadline = time.monotonic() + 30
    while instance.reduce_rounds()[rank] == before:
        assert time.monotonic() < deadline and not task.done(), "the batch never started"
        await asyncio.sleep(0.0005)
    return task


@pytest.mark.parametrize("group", ["g1", "g2"])
def test_overlapping_batches_each_get_their_own_answers(group, request, minilm_engine, run_async):
    # The queue manager hands the next batch over while one computes (instance.pipeline): the
    # calls overlap in the pipes, and each must get its own vectors back. On g2 the big batch
    # is also split into several requests, all in flight with the others.
    instance = request.getfixturevalue(group)
    assert instance.pipeline >= 2
    batches = [token_batch(n, 30522, lengths=[length] * n, seed=10 + n) for n, length in ((16, 75), (3, 9), (7, 30))]

    async def overlapping():
        return await asyncio.gather(*(instance.embed(batch) for batch in batches))

    for sequences, vectors in zip(batches, run_async(overlapping()), strict=True):
        assert_close(vectors, reference_embeddings(minilm_engine, sequences), atol=1e-5)


def test_killing_a_rank_fails_the_batch_then_restart_heals(g2, minilm_engine, run_async):
    big = token_batch(32, 30522, lengths=[200] * 32, seed=4)

    async def kill_mid_batch():
        task = await embed_until_in_flight(g2, big, rank=1)
        victim, survivor = g2.pids[1], g2.pids[0]
        os.kill(victim, signal.SIGKILL)
        # Seen as rank 1's death at once (its pidfd), not at rank 0's reduce timeout: that would
        # fail the batch with rank 0's "timed out after 4 s waiting for rank 1" instead.
        with pytest.raises(InstanceFailed, match=r"rank 1 .*killed by SIGKILL"):
            await task
        return victim, survivor

    victim, survivor = run_async(kill_mid_batch())
    assert g2.info()["running"] is False
    assert own_segments() == []
    with pytest.raises(ProcessLookupError):  # the parent killed (and reaped) rank 0 too
        os.kill(survivor, 0)
    with pytest.raises(InstanceFailed, match="restart"):
        run_async(g2.embed(big[:1]))
    run_async(g2.restart())
    assert victim not in g2.pids
    sequences = token_batch(4, 30522, seed=5)
    assert_close(run_async(g2.embed(sequences)), reference_embeddings(minilm_engine, sequences))


def test_a_stuck_rank_times_out_in_the_all_reduce(g2, minilm_engine, run_async):
    os.kill(g2.pids[1], signal.SIGSTOP)  # alive but silent: only the reduce timeout can tell
    # The reduce timeout (4 s) is what failed the batch, not the batch's own (300 s) or a heartbeat's.
    with pytest.raises(InstanceFailed, match=r"rank 0: .*timed out after 4 s waiting for rank 1"):
        run_async(g2.embed(token_batch(2, 30522, seed=6)))
    run_async(g2.restart())
    sequences = token_batch(2, 30522, seed=7)
    assert_close(run_async(g2.embed(sequences)), reference_embeddings(minilm_engine, sequences))


def test_killing_rank_zero_while_idle_fails_the_next_batch(g2, run_async):
    os.kill(g2.pids[0], signal.SIGKILL)
    with pytest.raises(InstanceFailed, match="rank 0"):
        run_async(g2.embed(token_batch(2, 30522, seed=8)))
    run_async(g2.restart())
    assert run_async(g2.embed(token_batch(1, 30522, seed=9))).shape == (1, 384)
