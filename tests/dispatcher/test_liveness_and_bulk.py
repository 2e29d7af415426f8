"""Bulk requests larger than the queues, a stopped engine process, and every engine killed:
each against a real `windve serve` whose CPU pool has two engine processes and depth 8."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx
import numpy as np
import pytest

from tests.servers import ServerProcess, engine_pids, start_server, wait_for, write_plan_config

DEPTH = 8
HEARTBEAT_TIMEOUT = 2.0
ANSWER_BOUND = 15.0  # seconds: what a stopped engine may cost a request, failover included


@pytest.fixture(scope="module")
def two_engines(tmp_path_factory) -> ServerProcess:
    folder = tmp_path_factory.mktemp("liveness")
    config = write_plan_config(
        folder,
        [{"pool": "cpu", "device": "cpu", "cores": [0]}, {"pool": "cpu", "device": "cpu", "cores": [1]}],
        cpu_depth=DEPTH,
        depth_control="static",
        heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT,
    )
    server = start_server(folder, "--config", config, "--cache-size", "0")
    yield server
    server.stop()


def _healthy(server: ServerProcess, engines: int = 2) -> bool:
    pids = engine_pids(server.url)
    return len(pids) == engines and httpx.get(server.url + "/health").json()["status"] == "ok"


def test_requests_larger_than_the_depth_are_admitted_in_parts(two_engines, reference_model):
    texts = [f"bulk text {i} on how retrieval pipelines embed passages" for i in range(64)]
    answer = httpx.post(two_engines.url + "/embed", json={"inputs": texts}, timeout=120)
    assert answer.status_code == 200, answer.text
    got = np.array(answer.json())
    assert got.shape == (64, 384)
    want = reference_model.encode(texts, normalize_embeddings=True)
    assert float(np.min(np.sum(got * want, axis=1))) > 0.9999

    many = [f"passage {i} of a long document" for i in range(2048)]
    answer = httpx.post(two_engines.url + "/v1/embeddings", json={"input": many, "model": "m"}, timeout=300)
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    assert [item["index"] for item in data] == list(range(2048))
    sample = [0, 1023, 2047]
    want = reference_model.encode([many[i] for i in sample], normalize_embeddings=True)
    for row, i in zip(want, sample):
        assert float(np.array(data[i]["embedding"]) @ row) > 0.9999


def _timed_embed(url: str, i: int) -> tuple[int, float]:
    started = time.monotonic()
    response = httpx.post(url + "/embed", json={"inputs": [f"query {i} about a stopped engine"]}, timeout=60)
    return response.status_code, time.monotonic() - started


def test_a_stopped_engine_is_noticed_and_its_requests_answered(two_engines):
    wait_for(lambda: _healthy(two_engines))
    victim = engine_pids(two_engines.url)[0]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        first = [pool.submit(_timed_embed, two_engines.url, i) for i in range(12)]
        os.kill(victim, signal.SIGSTOP)
        later = [pool.submit(_timed_embed, two_engines.url, 100 + i) for i in range(24)]
        answers = [future.result() for future in first + later]
    try:
        statuses = [status for status, _ in answers]
        assert set(statuses) == {200}, statuses
        slowest = max(seconds for _, seconds in answers)
        assert slowest <= ANSWER_BOUND, f"a request took {slowest:.1f} s with one engine stopped"
        # The stopped process was killed (a heartbeat missed) and its instance restarted.
        wait_for(lambda: victim not in engine_pids(two_engines.url) and _healthy(two_engines))
        assert "no heartbeat" in two_engines.log()
    finally:
        try:
            os.kill(victim, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_with_every_engine_killed_requests_get_503_not_429(two_engines):
    wait_for(lambda: _healthy(two_engines))
    for pid in engine_pids(two_engines.url):
        os.kill(pid, signal.SIGKILL)
    statuses = set()
    for i in range(6):
        answer = httpx.post(two_engines.url + "/embed", json={"inputs": [f"after the kill {i}"]}, timeout=60)
        statuses.add(answer.status_code)
        if answer.status_code == 503:
            assert answer.headers["retry-after"]
            assert answer.json()["error_type"] in ("unhealthy", "backend")
    assert 503 in statuses and statuses <= {503, 200}, statuses  # 200 once an engine is back
    wait_for(lambda: _healthy(two_engines))
    assert httpx.post(two_engines.url + "/embed", json={"inputs": ["back"]}, timeout=60).status_code == 200
