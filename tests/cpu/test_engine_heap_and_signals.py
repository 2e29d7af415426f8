"""An engine process gives freed heap back to the system, and outlives a signal to its process group.

Batches of every shape had left glibc's heap growing without end (0.5-0.9 MB per new shape; the
figures are in bench/ENGINE_MEMORY.md, from bench/engine_memory.py); Ctrl-C or systemd's stop
had killed engines mid-batch, while the parent drained.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import threading

import numpy as np

from tests.cpu.cpu_helpers import assert_close, reference_embeddings, token_batch
from tests.redis.redis_test_support import FakeClock
from windve.engine_process import heap, wire
from windve.engine_process.heap import HeapTrimmer
from windve.engine_process.instance import EngineProcessInstance
from windve.engine_process.worker import EngineServer

WAIT = 30.0


def test_the_heap_is_trimmed_at_most_every_trim_seconds():
    clock, trims = FakeClock(), []
    trimmer = HeapTrimmer(trim=trims.append, clock=clock)
    trimmer.after_batch()
    assert trims == []  # the start counts as a trim: nothing freed yet
    clock.advance(heap.TRIM_SECONDS)
    trimmer.after_batch()
    clock.advance(heap.TRIM_SECONDS / 2)
    trimmer.after_batch()
    assert trims == [0]
    clock.advance(heap.TRIM_SECONDS / 2)
    trimmer.after_batch()
    assert trims == [0, 0]


def test_this_c_library_has_malloc_trim():
    """glibc here (Debian): the trimmer is not silently a no-op where it matters."""
    assert heap._malloc_trim() is not None


class OnesEngine:
    dim = 2

    def stage(self, input_ids, attention_mask):
        return input_ids

    def run(self, staged):
        return np.ones((len(staged), 2), dtype=np.float32)


def test_the_engine_loop_trims_after_the_answers(monkeypatch):
    trims: list[int] = []
    monkeypatch.setattr(heap, "TRIM_SECONDS", 0.0)
    monkeypatch.setattr(heap, "_malloc_trim", lambda: trims.append)
    parent, child = multiprocessing.Pipe()
    server = EngineServer.__new__(EngineServer)  # the loop only; no model to load
    server.conn, server.pad_id, server.engine = child, 0, OnesEngine()
    loop = threading.Thread(target=server.serve, daemon=True)
    loop.start()
    for request_id in (1, 2):
        parent.send_bytes(wire.encode_request(request_id, [np.array([5, 7], dtype=np.int32)]))
        assert parent.poll(WAIT)
        parent.recv_bytes()
    parent.send_bytes(wire.encode_stop())
    loop.join(WAIT)
    assert trims == [0, 0]


def test_an_engine_outlives_sigint_and_sigterm_and_still_answers(minilm_spec, minilm_engine, run_async):
    instance = EngineProcessInstance(minilm_spec, name="sig", rank_cores=[[0]], numa_nodes=[0], threads=1)
    run_async(instance.start())
    try:
        (pid,) = instance.pids
        sequences = token_batch(4, 30522, seed=5)
        for sig in (signal.SIGINT, signal.SIGTERM):  # what a terminal's Ctrl-C and systemd send the group
            os.kill(pid, sig)
            assert_close(run_async(instance.embed(sequences)), reference_embeddings(minilm_engine, sequences))
        assert instance.pids == [pid]  # the same process answered: not a restart
    finally:
        run_async(instance.close())


HOLDER = """
import asyncio, sys
from windve.engine_process.instance import EngineProcessInstance
from windve.model import load_model_spec

async def hold():
    instance = EngineProcessInstance(load_model_spec(), name="orphan", rank_cores=[[0]], numa_nodes=[0], threads=1)
    await instance.start()
    print(instance.pids[0], flush=True)
    await asyncio.to_thread(sys.stdin.read)  # until the test kills this process

asyncio.run(hold())
"""


def test_an_engine_stopped_when_its_parent_is_killed_dies_with_it():
    """SIGSTOPped, it never reads its socket's EOF: only the kernel's parent-death signal ends it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    engine = None
    try:
        engine = int(holder.stdout.readline())
        engine_exit = os.pidfd_open(engine)
        os.kill(engine, signal.SIGSTOP)
        holder.kill()
        holder.wait(WAIT)
        readable, _, _ = select.select([engine_exit], [], [], WAIT)
        os.close(engine_exit)
        assert readable, f"engine {engine} outlived its killed parent by {WAIT} s"
    finally:
        holder.kill()
        holder.wait(WAIT)
        if engine is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine, signal.SIGKILL)
