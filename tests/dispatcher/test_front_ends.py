"""Several front-end processes, one dispatcher, engine processes for both pools: end to end.

The accelerator pool runs a CPU engine through the explicit plan (the accelerator path, on
this CPU): its instance is an engine process like any accelerator's. Every test drives a
real `windve serve --http-workers 2` over HTTP on 127.0.0.1.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.servers import (
    ServerProcess,
    engine_pids,
    long_text,
    metric_sum,
    start_server,
    sums_by_label,
    wait_for,
    write_plan_config,
)
from windve.dispatcher.workdir import remove_stale_workdirs

ACC_DEPTH, CPU_DEPTH = 3, 3


def _info(server: ServerProcess) -> dict:
    return httpx.get(server.url + "/info", timeout=30).json()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _dead(pid: int) -> bool:
    """Gone, or a zombie its parent has not reaped: it accepts nothing more."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def _embed(url: str, texts: list[str]) -> httpx.Response | Exception:
    try:
        return httpx.post(url + "/embed", json={"inputs": texts}, timeout=120)
    except httpx.HTTPError as error:
        return error


def _two_front_ends(folder, *extra: str, env: dict[str, str] | None = None, **settings) -> ServerProcess:
    config = write_plan_config(
        folder,
        [{"pool": "accelerator", "device": "cpu", "cores": [0]}, {"pool": "cpu", "device": "cpu", "cores": [1]}],
        accelerator_depth=ACC_DEPTH,
        cpu_depth=CPU_DEPTH,
        accelerator_pipeline=3,
        depth_control="static",
        dtype="fp32",
        **settings,
    )
    return start_server(folder, "--config", config, "--cache-size", "0", "--http-workers", "2", *extra, env=env)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = _two_front_ends(tmp_path_factory.mktemp("front-ends"))
    yield server
    server.stop()


def test_every_process_has_its_part(served):
    info = _info(served)
    dispatcher = info["dispatcher"]
    assert dispatcher["pid"] == served.process.pid
    assert len(dispatcher["front_ends"]) == 2 and served.process.pid not in dispatcher["front_ends"]
    pools = {pool["name"]: pool for pool in info["pools"]}
    assert {name: pool["depth"] for name, pool in pools.items()} == {"accelerator": ACC_DEPTH, "cpu": CPU_DEPTH}
    engines = {name: pool["instances"][0] for name, pool in pools.items()}
    # Both pools' instances are engine processes pinned to their own core, neither of them the
    # dispatcher nor a front end.
    assert engines["accelerator"]["kind"] == engines["cpu"]["kind"] == "engine-process"
    assert engines["accelerator"]["ranks"][0]["affinity"] == [0]
    assert engines["cpu"]["ranks"][0]["affinity"] == [1]
    # accelerator_pipeline sets the batches the accelerator pool's engine holds; a CPU engine holds two.
    assert (engines["accelerator"]["pipeline"], engines["cpu"]["pipeline"]) == (3, 2)
    engine_pids = {pid for engine in engines.values() for pid in engine["pids"]}
    assert not engine_pids & ({served.process.pid} | set(dispatcher["front_ends"]))
    metrics = httpx.get(served.url + "/metrics").text
    for family in ("windve_engine_rss_bytes", "windve_engine_cpu_seconds_total"):
        for instance in ("accelerator-0", "cpu-0"):
            assert f'{family}{{engine="{instance}",rank="0"}}' in metrics, (family, instance)


def test_concurrent_requests_through_both_front_ends_get_their_own_vectors(served, reference_model):
    """Admission is atomic across front ends: in flight never passes a pool's depth, and every
    answer holds exactly its own texts' vectors (none lost, mixed or answered twice)."""
    requests = [[long_text(i * 10 + j) for j in range(1 + i % 3)] for i in range(24)]
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(lambda texts: _embed(served.url, texts), requests))
    statuses = [getattr(answer, "status_code", answer) for answer in answers]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= 2, statuses
    for texts, answer in zip(requests, answers):
        if answer.status_code == 200:
            got = np.array(answer.json())
            want = reference_model.encode(texts, normalize_embeddings=True)
            assert got.shape == want.shape
            assert np.min(np.sum(got * want, axis=1)) > 0.9999
            # TEI's timing headers, from the dispatcher's process: the pools that computed them
            computed_by = set(answer.headers["x-compute-type"].split("+"))
            assert computed_by <= {"accelerator", "cpu"} and computed_by, answer.headers["x-compute-type"]
            assert int(answer.headers["x-inference-time"]) + int(answer.headers["x-queue-time"]) <= int(
                answer.headers["x-total-time"]
            ) + 2
        else:
            assert answer.json()["error_type"] == "overloaded"
    peak = _info(served)["dispatcher"]["peak_in_flight"]
    assert peak["accelerator"] <= ACC_DEPTH and peak["cpu"] <= CPU_DEPTH, peak
    metrics = httpx.get(served.url + "/metrics").text
    # Both front ends' request counters add up in one exposition.
    ok = metric_sum(metrics, "windve_requests_total", route="embed", status="200")
    assert ok >= statuses.count(200)
    # The engines' own time per batch, beside the dispatcher's view of it (windve_inference_seconds),
    # pool by pool.
    computed = sums_by_label(metrics, "windve_engine_compute_seconds_count", "pool")
    assert computed == sums_by_label(metrics, "windve_inference_seconds_count", "pool")
    assert set(computed) <= {"accelerator", "cpu"} and sum(computed.values()) >= 1


TEXTS = [long_text(500 + i) for i in range(32)]


@pytest.fixture(scope="module")
def text_vectors(reference_model) -> np.ndarray:
    return reference_model.encode(TEXTS, normalize_embeddings=True)


def _pools(server: ServerProcess) -> dict[str, int]:
    return {pool["name"]: pool["in_flight"] for pool in _info(server)["pools"]}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bursts=st.lists(st.lists(st.integers(0, len(TEXTS) - 1), min_size=1, max_size=5), min_size=2, max_size=14))
def test_admission_is_atomic_across_front_ends_for_any_burst(served, text_vectors, bursts: list[list[int]]):
    """Any burst of requests of 1-5 texts, sent at once over new connections that the kernel spreads
    over both front ends: in flight never passes a pool's depth; each request is answered once,
    200 with exactly its texts' vectors in order or 429; the dispatcher admitted exactly the
    queries of the 200s (none lost, none twice); and nothing stays in flight."""
    before = httpx.get(served.url + "/metrics").text
    with concurrent.futures.ThreadPoolExecutor(len(bursts)) as pool:
        answers = list(pool.map(lambda picks: _embed(served.url, [TEXTS[i] for i in picks]), bursts))
    after = httpx.get(served.url + "/metrics").text
    statuses = [getattr(answer, "status_code", answer) for answer in answers]
    assert set(statuses) <= {200, 429}, statuses
    for picks, answer in zip(bursts, answers):
        if answer.status_code == 200:
            got = np.array(answer.json())
            assert got.shape == (len(picks), text_vectors.shape[1])
            assert np.min(np.sum(got * text_vectors[picks], axis=1)) > 0.9999
    ok = metric_sum(after, "windve_requests_total", route="embed", status="200")
    assert ok - metric_sum(before, "windve_requests_total", route="embed", status="200") == statuses.count(200)
    admitted = metric_sum(after, "windve_pool_dispatched_queries_total")
    answered = sum(len(picks) for picks, status in zip(bursts, statuses) if status == 200)
    assert admitted - metric_sum(before, "windve_pool_dispatched_queries_total") == answered
    peak = _info(served)["dispatcher"]["peak_in_flight"]
    assert peak.get("accelerator", 0) <= ACC_DEPTH and peak.get("cpu", 0) <= CPU_DEPTH, peak
    deadline = time.monotonic() + 30
    while any(_pools(served).values()):  # a slot is freed in the step after its answer left
        assert time.monotonic() < deadline, _pools(served)
        time.sleep(0.01)  # polling the dispatcher's state, bounded by the deadline


def test_killing_a_front_end_loses_no_query_of_the_other(tmp_path, reference_model):
    server = _two_front_ends(tmp_path)
    try:
        victim = _info(server)["dispatcher"]["front_ends"][0]
        texts = [[long_text(i)] for i in range(40)]

        def timed(request: list[str]) -> tuple[float, httpx.Response | Exception]:
            return time.monotonic(), _embed(server.url, request)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(timed, request) for request in texts]
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not _dead(victim):
                assert time.monotonic() < deadline, "the front end lived on 10 s after SIGKILL"
                time.sleep(0.001)  # polling the kernel's view of it, bounded by the deadline
            killed = time.monotonic()
            answers = [future.result() for future in futures]
        # A client of the killed front end may lose its connection; every other one, and every
        # request sent after the kill (it waits in the dead one's socket for the replacement),
        # gets its own vector or BUSY, never a wrong answer or a hang.
        assert sum(started > killed for started, _ in answers) >= 1
        for request, (started, answer) in zip(texts, answers):
            if isinstance(answer, Exception):
                assert isinstance(answer, httpx.TransportError) and started <= killed, answer
                continue
            assert answer.status_code in (200, 429), answer.text
            if answer.status_code == 200:
                want = reference_model.encode(request, normalize_embeddings=True)
                assert float(np.array(answer.json())[0] @ want[0]) > 0.9999
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the supervisor replaces the dead front end
            front_ends = _info(server)["dispatcher"]["front_ends"]
            if len(front_ends) == 2 and victim not in front_ends:
                break
            time.sleep(0.1)  # polling a condition with a deadline
        assert len(front_ends) == 2 and victim not in front_ends
        # Nothing stays admitted for the dead front end's clients: every slot is free again.
        pools = _info(server)["pools"]
        assert all(pool["in_flight"] == 0 for pool in pools), pools
        assert "exited" in server.log()
        assert _embed(server.url, ["after the restart"]).status_code == 200
    finally:
        server.stop()


def test_killing_the_accelerator_pools_engine_loses_no_query_of_another_process(tmp_path, text_vectors):
    """Under load through both front ends, SIGKILL the accelerator pool's engine process: only
    the queries it held may fail, with a 503 that says so; every other request gets its own
    vectors or BUSY (none a lost connection), the instance comes back in a new process, and the
    pools serve on."""
    server = _two_front_ends(tmp_path)
    try:
        (victim,) = engine_pids(server.url, "accelerator")
        stop = threading.Event()
        answers: list[tuple[list[int], httpx.Response | Exception]] = []

        def client(seed: int) -> None:
            picks = [seed % len(TEXTS)]
            while not stop.is_set():
                answers.append((picks, _embed(server.url, [TEXTS[i] for i in picks])))
                picks = [(picks[0] + 7) % len(TEXTS), (picks[0] + 3) % len(TEXTS)][: 1 + len(answers) % 2]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            clients = [pool.submit(client, seed) for seed in range(8)]
            wait_for(lambda: len(answers) >= 16, "no load flowing")
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: _replaced(server, victim), "the accelerator pool's engine did not come back")
            served_after = len(answers) + 16
            wait_for(lambda: len(answers) >= served_after, "no answers after the restart")
            stop.set()
            for done in clients:
                done.result()
        # Only what the killed process held may fail (its pool has no other instance to take it,
        # and the CPU pool, full under this load, takes them only as far as it has room): at most
        # the pool's depth of queries, each a 503 naming it. Every other request ends
        # with its own vectors or BUSY.
        lost = [answer for _, answer in answers if getattr(answer, "status_code", None) not in (200, 429)]
        assert len(lost) <= ACC_DEPTH, [getattr(answer, "text", answer) for answer in lost]
        for answer in lost:
            assert answer.status_code == 503 and answer.json()["error_type"] == "backend", answer
            assert "accelerator-0" in answer.text and "SIGKILL" in answer.text, answer.text
        for picks, answer in answers:
            if answer.status_code == 200:
                assert np.min(np.sum(np.array(answer.json()) * text_vectors[picks], axis=1)) > 0.9999
        assert sum(answer.status_code == 200 for _, answer in answers) >= 16
        assert re.search(r"instance accelerator-0 failed \(.*\); moving its queries", server.log())
    finally:
        server.stop()


def _replaced(server: ServerProcess, victim: int) -> bool:
    """The accelerator pool's engine runs in a new process, and every instance serves."""
    pids = engine_pids(server.url, "accelerator")
    return bool(pids) and victim not in pids and httpx.get(server.url + "/health", timeout=30).json()["status"] == "ok"


def test_a_front_end_that_stops_beating_is_killed_and_replaced(tmp_path):
    """A front end whose event loop stops turning (here SIGSTOP) holds the connections the kernel
    hashes to its listening socket. It stops beating, and the parent kills it and starts another on
    the same socket; the other front end is left alone."""
    server = _two_front_ends(tmp_path, frontend_heartbeat_timeout_seconds=3.0)
    victim = None
    try:
        victim, other = _info(server)["dispatcher"]["front_ends"]
        os.kill(victim, signal.SIGSTOP)
        stopped = time.monotonic()
        deadline = stopped + 120
        front_ends: list[int] = [victim, other]
        while time.monotonic() < deadline:
            # A request the kernel hashes to the stopped front end's socket waits for its replacement.
            front_ends = httpx.get(server.url + "/info", timeout=120).json()["dispatcher"]["front_ends"]
            if len(front_ends) == 2 and victim not in front_ends:
                break
            time.sleep(0.1)  # polling a condition with a deadline
        assert len(front_ends) == 2 and victim not in front_ends and other in front_ends, front_ends
        assert time.monotonic() - stopped >= 3.0  # not before its heartbeat timed out
        assert not _alive(victim)
        assert f"(pid {victim}) silent for" in server.log()
        answers = [_embed(server.url, [f"after the replacement {i}"]) for i in range(4)]
        assert [getattr(answer, "status_code", answer) for answer in answers] == [200] * 4
    finally:
        if victim is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)  # if the test failed before the parent killed it
        server.stop()


def test_sigterm_drains_every_process(tmp_path):
    server = _two_front_ends(tmp_path)
    info = _info(server)
    children = info["dispatcher"]["front_ends"] + engine_pids(server.url)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(_embed, server.url, [long_text(i)]) for i in range(6)]
        # SIGTERM once a front end has read every request (admitted and not yet answered, or
        # answered): one still connecting then would wait in the listening socket's queue after
        # the front ends stop accepting, and be reset at exit (docs/operations.md), which is
        # the drain's documented edge, not what this test is about.
        deadline = time.monotonic() + 60
        while True:
            in_flight = sum(p["in_flight"] for p in _info(server)["pools"])
            if in_flight + sum(future.done() for future in futures) >= len(futures):
                break
            assert time.monotonic() < deadline, f"{in_flight} in flight after 60 s"
            time.sleep(0.01)  # polling the server's state, bounded by the deadline
        server.process.send_signal(signal.SIGTERM)
        answers = [future.result() for future in futures]
    assert server.process.wait(90) == 0, server.log()
    errors = [answer for answer in answers if isinstance(answer, Exception)]
    assert not errors, errors
    assert {answer.status_code for answer in answers} <= {200, 429}
    # What was admitted at the signal is answered, not refused: the drain lets it finish.
    assert in_flight >= 1 and sum(answer.status_code == 200 for answer in answers) >= in_flight
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)  # children are reaped by now or very soon; bounded poll
    assert not [pid for pid in children if _alive(pid)]


def test_front_ends_end_with_a_dispatcher_killed_and_free_the_port(tmp_path):
    """SIGKILL leaves the dispatcher no time to stop them: the kernel tells each front end, and the
    port is free for the next `windve serve`, not held by front ends answering 503 for ever; the
    folder it shared with them is left, and the next service's start removes it. The TMPDIR is
    deep: the dispatcher's socket path in it is past a Unix address's 107 bytes (unix_path.py)."""
    temporary = tmp_path / ("tmp-" + "x" * 60)
    temporary.mkdir()
    server = _two_front_ends(tmp_path, env={"TMPDIR": str(temporary)})
    children = _info(server)["dispatcher"]["front_ends"] + engine_pids(server.url)
    [shared] = temporary.glob("windve-*")
    assert remove_stale_workdirs(str(temporary)) == []  # in use
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(30)
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)  # bounded poll for the orphans' exits
    assert not [pid for pid in children if _alive(pid)], server.log()
    socket.create_server(("127.0.0.1", server.port)).close()  # a plain bind: nothing listens there now
    assert remove_stale_workdirs(str(temporary)) == [shared]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_port_in_use_is_a_message_and_exit_3_before_any_engine_starts(tmp_path, workers):
    """One front end (the default without an accelerator) left the bind to uvicorn, after the
    application had started: the plan was logged and the engines spawned before the error."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "windve.commands.serve", "--host", "127.0.0.1", "--port", str(port),
             "--http-workers", str(workers)],
            capture_output=True, text=True, timeout=120, env=os.environ | {"TMPDIR": str(tmp_path)},
        )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert f"windve serve: cannot listen on 127.0.0.1:{port}: " in result.stderr and "Traceback" not in result.stderr
    assert "device plan" not in result.stderr and "startup" not in result.stderr, result.stderr
    assert not list(tmp_path.glob("windve-*"))  # no work folder left behind


def test_a_connection_made_while_draining_is_answered_not_left_to_be_reset(tmp_path):
    """Front ends that stopped accepting at SIGTERM left new connections in the listening socket's
    queue, which the parent held open: they waited for the whole drain and were then reset. A
    draining front end keeps accepting while what it held finishes, and answers at once."""
    server = _two_front_ends(tmp_path)
    held = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    try:
        # A request whose body is still coming holds its front end in the drain for as long as
        # this test chooses; /health first, so that the connection is surely accepted.
        held.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert held.recv(65536).startswith(b"HTTP/1.1 200")
        body = json.dumps({"inputs": ["held in the drain"]}).encode()
        head = f"POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        held.sendall(head.encode() + b"\r\n" + body[:5])
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while server.log().count("draining: accepting") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # bounded poll of the log for both front ends' drain
        assert server.log().count("draining: accepting") == 2, server.log()
        for i in range(4):
            answer = httpx.post(server.url + "/embed", json={"inputs": [f"while draining {i}"]}, timeout=20)
            assert answer.status_code == 429 and "shutting down" in answer.json()["error"], answer.text
            assert answer.headers["connection"] == "close"
        held.sendall(body[5:])
        assert held.recv(65536).split(b"\r\n", 1)[0] in (b"HTTP/1.1 200 OK", b"HTTP/1.1 429 Too Many Requests")
    finally:
        held.close()
    assert server.process.wait(60) == 0, server.log()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health", timeout=5)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one to serve on, one for the engine")
def test_engines_are_planned_over_every_cpu_not_only_the_service_cores(tmp_path):
    """The parent moves onto the service cores before it starts the engines; planned from there,
    every engine was squeezed onto those cores (on a 16-core GPU host: three of them)."""
    service, engine = sorted(os.sched_getaffinity(0))[:2]
    config = write_plan_config(
        tmp_path,
        [{"pool": "accelerator", "device": "cpu", "cores": [engine]}],
        reserved_cores=[service],
        accelerator_depth=ACC_DEPTH,
        depth_control="static",
        dtype="fp32",
    )
    server = start_server(tmp_path, "--config", config, "--cache-size", "0", "--http-workers", "2")
    try:
        info = _info(server)
        assert engine in info["hardware"]["cpu"]["usable"] and service in info["hardware"]["cpu"]["usable"]
        assert info["pools"][0]["instances"][0]["ranks"][0]["affinity"] == [engine]
        for pid in [server.process.pid, *info["dispatcher"]["front_ends"]]:
            assert os.sched_getaffinity(pid) == {service}
        assert _embed(server.url, ["planned over both cores"]).status_code == 200
    finally:
        server.stop()
