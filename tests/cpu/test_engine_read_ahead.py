"""The engine process's read-ahead: batch N+1 is received and staged while batch N runs.

EngineServer's loop over a real pipe, in this process, with an engine that records what happens
when; the engine processes themselves are tested in test_cpu_instance_minilm.py.
"""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

from windve.engine_process import wire
from windve.engine_process.worker import EngineServer

WAIT = 30.0  # seconds: a bound on a wait that a working loop ends at once


class RecordingEngine:
    """Batch k (its first token id) embeds as [k, k]; batch 2 is staged while batch 1 runs."""

    dim = 2

    def __init__(self) -> None:
        self.second_staged = threading.Event()

    def stage(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        first = int(input_ids[0, 0])
        if first == 13:
            raise ValueError("batch 13 cannot be staged")
        if first == 2:
            self.second_staged.set()
        return input_ids

    def run(self, staged: np.ndarray) -> np.ndarray:
        first = int(staged[0, 0])
        # Without read-ahead batch 2 is received only after batch 1 answered: this wait would end
        # in its timeout and batch 1 would fail.
        if first == 1 and not self.second_staged.wait(WAIT):
            raise AssertionError("batch 2 was not staged while batch 1 ran")
        return np.full((len(staged), 2), float(first), dtype=np.float32)


@pytest.fixture
def served():
    parent, child = multiprocessing.Pipe()
    server = EngineServer.__new__(EngineServer)  # the loop only; no model to load
    server.conn, server.pad_id, server.engine = child, 0, RecordingEngine()
    loop = threading.Thread(target=server.serve, daemon=True)
    loop.start()
    yield parent
    parent.send_bytes(wire.encode_stop())
    loop.join(WAIT)
    assert not loop.is_alive(), "the loop did not end on STOP"


def _send(conn, request_id: int, first_token: int) -> None:
    conn.send_bytes(wire.encode_request(request_id, [np.array([first_token, 7], dtype=np.int32)]))


def _answer(conn) -> tuple[int, int, object]:
    assert conn.poll(WAIT), "no answer"
    message = conn.recv_bytes()
    kind, request_id = wire.message_kind(message)
    if kind == wire.ERROR:
        return kind, request_id, wire.decode_json(message)["message"]
    return kind, request_id, wire.decode_result(message)


def test_the_next_batch_is_staged_while_one_runs(served):
    _send(served, 101, 1)
    _send(served, 102, 2)
    first, second = _answer(served), _answer(served)
    assert first[:2] == (wire.RESULT, 101) and np.array_equal(first[2], [[1.0, 1.0]]), first
    assert second[:2] == (wire.RESULT, 102) and np.array_equal(second[2], [[2.0, 2.0]]), second


def test_a_batch_that_cannot_be_staged_fails_alone_and_in_its_turn(served):
    _send(served, 7, 13)
    _send(served, 8, 5)
    failed, answered = _answer(served), _answer(served)
    assert failed[:2] == (wire.ERROR, 7) and "batch 13 cannot be staged" in failed[2]
    assert answered[:2] == (wire.RESULT, 8) and np.array_equal(answered[2], [[5.0, 5.0]])


def test_the_loop_ends_when_the_parent_goes_away():
    parent, child = multiprocessing.Pipe()
    server = EngineServer.__new__(EngineServer)
    server.conn, server.pad_id, server.engine = child, 0, RecordingEngine()
    loop = threading.Thread(target=server.serve, daemon=True)
    loop.start()
    parent.close()
    loop.join(WAIT)
    assert not loop.is_alive()
