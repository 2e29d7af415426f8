"""The warm-up probe times the path that serves: POST /embed through the service's own front end.

A default `windve serve` (no depth setting, no calibration) probes over HTTP on loopback, with one
front end in its own process and with two front ends beside the dispatcher; /health says ok only
after. The runtime embedded without a listening server (the app under a test client), or whose
HTTP probe cannot connect, probes in-process. Real parts throughout: uvicorn on 127.0.0.1, engine
processes, the bundled model. Nothing here depends on how fast this machine is.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from starlette.testclient import TestClient

from tests.servers import ServerProcess, free_port, metric_sum, start_server
from windve.depths import PROBE_TOKENS, STEADY_QUERIES
from windve.frontend.app import create_app
from windve.settings import Settings


def _pools(server: ServerProcess) -> list[dict]:
    info = httpx.get(server.url + "/info", timeout=30).json()
    assert info["ready"] is True
    return info["pools"]


def _probe_queries(fit: dict) -> int:
    # One unmeasured batch, three single queries, the steady round (two batches' worth of clients),
    # and the settled round where the steady line's depth was another level.
    batch, steady, settled = fit["batch"], fit["steady_clients"], fit["settled_clients"]
    assert steady == 2 * batch
    return batch + 3 + (steady + (settled if settled != steady else 0)) * STEADY_QUERIES


def _check_probed_over_http(server: ServerProcess) -> None:
    """Read right after /health first said 200, before anyone else sent a request."""
    pools = _pools(server)
    for pool in pools:
        fit = pool["fit"]
        assert pool["depth_source"] == "warm-up probe (http)", fit.get("http_error")
        assert fit["path"] == "http" and "http_error" not in fit
        assert pool["depth"] >= 1 and pool["seed_depth"] == pool["depth"]
        assert fit["alpha"] > 0 and fit["beta"] > 0 and fit["query_tokens"] == PROBE_TOKENS
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    # Every probe query was an HTTP request that a front end tokenized; its Cache-Control kept the
    # embedding cache (on by default) out of it. The clients' metrics leave the probe's requests
    # out (a deploy had shown hundreds of requests over the SLO before its first client).
    queries = sum(_probe_queries(pool["fit"]) for pool in pools)
    assert metric_sum(metrics, "windve_tokenization_seconds_count") == queries
    assert metric_sum(metrics, "windve_requests_total") == metric_sum(metrics, "windve_input_tokens_total") == 0
    assert metric_sum(metrics, "windve_request_seconds_count") == 0
    assert metric_sum(metrics, "windve_pool_serving") == len(pools)  # ready: its queries are demand now
    assert metric_sum(metrics, "windve_cache_hits_total") == metric_sum(metrics, "windve_cache_misses_total") == 0


def _check_a_client_is_counted(server: ServerProcess) -> None:
    assert httpx.post(server.url + "/embed", json={"inputs": "a client"}, timeout=60).status_code == 200
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert metric_sum(metrics, "windve_requests_total", route="embed", status="200") == 1


def test_one_process_probes_through_its_own_front_end(tmp_path):
    server = start_server(tmp_path)  # the defaults: one front end here, no depth, no calibration, cache on
    try:
        _check_probed_over_http(server)
        assert "(warm-up probe (http))" in server.log()
        _check_a_client_is_counted(server)
    finally:
        server.stop()


def test_two_front_ends_take_the_probe_of_the_dispatcher(tmp_path):
    server = start_server(tmp_path, "--http-workers", "2")
    try:
        _check_probed_over_http(server)
        dispatcher = httpx.get(server.url + "/info", timeout=30).json()["dispatcher"]
        assert len(dispatcher["front_ends"]) == 2
        # The probe's pinned depths are the warm-up's, not the service's: not in the peak.
        assert dispatcher["peak_in_flight"] == {}
        _check_a_client_is_counted(server)
    finally:
        server.stop()


def _small_settings(**overrides) -> Settings:
    """One engine process and batches of 4: a short probe."""
    return Settings(
        cpu_layout="explicit", plan=[{"pool": "cpu", "cores": [0]}], max_batch_size=4, cache_size=0, **overrides
    )


def test_the_app_without_a_listening_server_probes_in_process():
    with TestClient(create_app(_small_settings())) as client:
        deadline = time.monotonic() + 180
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, client.get("/health").json()
            time.sleep(0.05)  # polling a real condition, bounded by the deadline
        [pool] = client.get("/info").json()["pools"]
        assert pool["depth_source"] == "warm-up probe (in-process)"
        assert pool["fit"]["path"] == "in-process" and pool["fit"]["batch"] == 4 and pool["depth"] >= 1
        assert client.post("/embed", json={"inputs": "served"}).status_code == 200


def test_a_failed_http_probe_falls_back_to_the_in_process_one():
    from windve.service import Runtime

    async def body() -> tuple[dict, list[bool]]:
        runtime = await Runtime.start(_small_settings(), probe_later=True)
        try:
            states = [runtime.accepting, runtime.ready]
            await runtime.finish_start(("127.0.0.1", free_port()))  # nothing listens there
            states += [runtime.accepting, runtime.ready]
            return runtime.info()["pools"][0], states
        finally:
            await runtime.close()

    pool, states = asyncio.run(body())
    assert states == [True, False, True, True]
    assert pool["depth_source"] == "warm-up probe (in-process)" and pool["depth"] >= 1
    assert "cannot connect" in pool["fit"]["http_error"]


def test_the_probe_reaches_a_wildcard_listener_on_loopback():
    from windve.probe import loopback

    assert loopback(("0.0.0.0", 8080)) == ("127.0.0.1", 8080)
    assert loopback(("::", 8080, 0, 0)) == ("::1", 8080)
    assert loopback(("10.1.2.3", 8080)) == ("10.1.2.3", 8080)


def test_front_ends_of_a_warming_dispatcher_admit_but_say_starting(tmp_path):
    """While the dispatcher probes, its board says ready (the probe's requests get through the front
    ends' room check) and warming (their /health says starting, 503)."""
    from windve.dispatcher.board import OK, StateBoard
    from windve.dispatcher.client import RemoteDispatcher

    board = StateBoard(tmp_path / "board", create=True)

    async def body() -> list:
        front_end = RemoteDispatcher(str(tmp_path / "dispatcher.sock"), tmp_path / "board")
        seen = []
        for warming in (True, False):
            board.write(ready=True, draining=False, health=OK, free_room=8, retry_after=1.0, warming=warming)
            front_end.check_room(1)  # no refusal
            seen.append(front_end.status()["status"])
        await front_end.close()
        return seen

    assert asyncio.run(body()) == ["starting", "ok"]
    board.close()


def test_a_round_makes_its_texts_before_it_takes_its_connections(tmp_path) -> None:
    """Made after, on a loaded host the texts took longer than a front end keeps an idle connection
    (5 s): the round met closed connections and the probe fell back to in-process timings."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from estimator.raw_http import Target
    from tests.estimator.conftest import SIM_SERVER
    from tests.servers import wait_healthy
    from windve.probe import _Client

    port = free_port()
    process = subprocess.Popen([sys.executable, str(SIM_SERVER), "--port", str(port)])
    try:
        wait_healthy(SimpleNamespace(url=f"http://127.0.0.1:{port}", process=process, log=lambda: ""), timeout=60)
        target = Target("127.0.0.1", port)
        opened_when_made: list[int] = []

        def requests():
            while True:
                opened_when_made.append(client.pool.opened)
                yield target.request("POST", "/embed", b'{"inputs": "a text"}', {})

        client = _Client(target, requests(), greeting=target.request("GET", "/health"))

        async def round_() -> list[float]:
            try:
                return await client.closed_loop(3, 2)
            finally:
                client.close()

        assert len(asyncio.run(round_())) == 6
        assert opened_when_made == [0] * 6  # every text of the round before any connection
    finally:
        process.terminate()
        process.wait(30)
