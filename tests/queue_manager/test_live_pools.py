"""The queue manager live: two real engine instances on this CPU stand in as the two pools.

Both pools are real pinned worker processes running the real model (explicit plan), so
these tests exercise dispatch, overflow, BUSY, failover and draining end to end over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import socket
import time

import httpx
import numpy as np
import pytest

from tests.servers import engine_pids, start_server, sums_by_label, write_plan_config

ACC_DEPTH, CPU_DEPTH = 2, 3


def long_text(i: int) -> str:
    return f"Request number {i} asks about " + " ".join(
        f"topic{i}-{j} of the retrieval pipeline and its embedding service" for j in range(24)
    )


def dispatched(url: str) -> dict[str, float]:
    return sums_by_label(httpx.get(url + "/metrics").text, "windve_pool_dispatched_queries_total", "pool")


def send_burst(port: int, bodies: list[bytes]) -> list[socket.socket]:
    """Open every connection first, then send all requests back to back: a true burst."""
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in bodies]
    for sock, body in zip(sockets, bodies):
        sock.sendall(
            b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    return sockets


def read_answers(sockets: list[socket.socket]) -> list[tuple[int, bytes, bytes]]:
    answers = []
    for sock in sockets:
        sock.settimeout(120)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        sock.close()
        head, _, payload = data.partition(b"\r\n\r\n")
        answers.append((int(head.split(b" ")[1]), head.lower(), payload))
    return answers


@pytest.fixture(scope="module")
def two_pool_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two-pools")
    config = write_plan_config(
        folder,
        [{"pool": "accelerator", "device": "cpu", "cores": [0]}, {"pool": "cpu", "device": "cpu", "cores": [1]}],
        accelerator_depth=ACC_DEPTH,
        cpu_depth=CPU_DEPTH,
        heterogeneous=True,
        dtype="fp32",
        heartbeat_timeout_seconds=60,  # the burst holds the engines still (SIGSTOP) for a moment
    )
    server = start_server(folder, "--config", config, "--cache-size", "0")
    yield server
    server.stop()


def test_burst_fills_accelerator_then_cpu_then_busy(two_pool_server, reference_model):
    server = two_pool_server
    info = httpx.get(server.url + "/info").json()
    assert [(p["name"], p["depth"]) for p in info["pools"]] == [("accelerator", ACC_DEPTH), ("cpu", CPU_DEPTH)]
    # Both pools run a pinned engine process: the accelerator pool's on core 0, the CPU pool's on core 1.
    accelerator, cpu = (pool["instances"][0] for pool in info["pools"])
    assert (accelerator["kind"], accelerator["ranks"][0]["affinity"]) == ("engine-process", [0])
    assert (cpu["kind"], cpu["ranks"][0]["affinity"]) == ("engine-process", [1])
    before = dispatched(server.url)
    texts = [long_text(i) for i in range(12)]
    bodies = [f'{{"inputs": "{text}"}}'.encode() for text in texts]
    refused = len(texts) - ACC_DEPTH - CPU_DEPTH
    # The engines are held still through the burst: no batch may end and free a slot before the
    # last request is read, however long the machine keeps this client from sending the rest.
    engines = [pid for instance in (accelerator, cpu) for pid in instance["pids"]]
    for pid in engines:
        os.kill(pid, signal.SIGSTOP)
    try:
        sockets = send_burst(server.port, bodies)
        deadline, waiting = time.monotonic() + 60, list(sockets)
        while len(sockets) - len(waiting) < refused and time.monotonic() < deadline:  # refusals come at once
            readable = select.select(waiting, [], [], max(0.0, deadline - time.monotonic()))[0]
            waiting = [sock for sock in waiting if sock not in readable]
    finally:
        for pid in engines:
            os.kill(pid, signal.SIGCONT)
    answers = read_answers(sockets)
    statuses = [status for status, _, _ in answers]
    assert statuses.count(200) == ACC_DEPTH + CPU_DEPTH, statuses
    assert statuses.count(429) == len(texts) - ACC_DEPTH - CPU_DEPTH, statuses
    after = dispatched(server.url)
    assert after["accelerator"] - before.get("accelerator", 0) == ACC_DEPTH
    assert after["cpu"] - before.get("cpu", 0) == CPU_DEPTH
    expected = reference_model.encode(texts, normalize_embeddings=True)
    for (status, head, payload), want in zip(answers, expected):
        if status == 200:
            got = np.array(json.loads(payload))[0]
            assert float(got @ want) > 0.9999
        else:
            assert json.loads(payload)["error_type"] == "overloaded"
            retry_after = head.split(b"retry-after: ")[1].split(b"\r\n")[0]
            assert int(retry_after) >= 1


def test_a_request_larger_than_the_free_room_is_answered_whole_in_parts(two_pool_server, reference_model):
    # Two and a half times what both idle pools hold at once: bulk, admitted in parts as room frees.
    texts = [long_text(100 + i) for i in range(2 * (ACC_DEPTH + CPU_DEPTH) + 2)]
    answer = httpx.post(two_pool_server.url + "/embed", json={"inputs": texts}, timeout=120)
    assert answer.status_code == 200, answer.text
    got = np.array(answer.json())
    want = reference_model.encode(texts, normalize_embeddings=True)
    assert got.shape == want.shape and float(np.min(np.sum(got * want, axis=1))) > 0.9999


async def _load(url: str, clients: int, stop: asyncio.Event, statuses: list[int]) -> list[int]:
    async def client(i: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            n = 0
            while not stop.is_set():
                response = await http.post("/embed", json={"inputs": f"client {i} query {n} " + long_text(i)[:200]})
                statuses.append(response.status_code)
                n += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return statuses


def test_killing_a_cpu_worker_loses_nothing_and_recovers(tmp_path):
    config = write_plan_config(
        tmp_path,
        [{"pool": "cpu", "device": "cpu", "cores": [0]}, {"pool": "cpu", "device": "cpu", "cores": [1]}],
        cpu_depth=64,
    )
    server = start_server(tmp_path, "--config", config, "--cache-size", "0")
    try:
        victim = engine_pids(server.url, "cpu")[0]

        async def scenario() -> list[int]:
            stop = asyncio.Event()
            statuses: list[int] = []
            load = asyncio.create_task(_load(server.url, 6, stop, statuses))
            await answers_reach(12, statuses, load)  # the load is flowing through both instances
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 120
            while True:
                pids = await asyncio.to_thread(engine_pids, server.url, "cpu")
                health = await asyncio.to_thread(httpx.get, server.url + "/health")
                if victim not in pids and len(pids) == 2 and health.json()["status"] == "ok":
                    break
                assert time.monotonic() < deadline, f"not recovered 120 s after the kill: {pids}, {health.text}"
                await asyncio.sleep(0.2)  # polling the server's state, bounded by the deadline
            await answers_reach(len(statuses) + 12, statuses, load)  # and the recovered pool keeps serving
            stop.set()
            return await load

        async def answers_reach(count: int, statuses: list[int], load: asyncio.Task) -> None:
            deadline = time.monotonic() + 120
            while len(statuses) < count:
                assert time.monotonic() < deadline and not load.done(), f"{len(statuses)} answers of {count}"
                await asyncio.sleep(0.05)  # polling the clients' tally, bounded by the deadline

        statuses = asyncio.run(scenario())
        assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
        assert victim not in engine_pids(server.url, "cpu")
        assert re.search(r"instance \S+ failed \(.*\); moving its queries and restarting it", server.log())
        metrics = httpx.get(server.url + "/metrics").text
        assert 'windve_pool_healthy_instances{pool="cpu"} 2.0' in metrics
    finally:
        server.stop()


def test_sigterm_under_load_answers_every_admitted_request(tmp_path):
    server = start_server(tmp_path, "--cache-size", "0", "--cpu-depth", "64")

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=httpx.Limits(max_connections=32)) as http:
            requests = [asyncio.create_task(http.post("/embed", json={"inputs": long_text(i)})) for i in range(24)]
            deadline = time.monotonic() + 60
            while (admitted := await in_flight(http)) < 12:
                assert time.monotonic() < deadline, f"only {admitted} of 24 requests admitted after 60 s"
                await asyncio.sleep(0.01)  # polling the server's state, bounded by the deadline
            server.process.send_signal(signal.SIGTERM)
            return admitted, await asyncio.gather(*requests, return_exceptions=True)

    async def in_flight(http: httpx.AsyncClient) -> int:
        return sum(pool["in_flight"] for pool in (await http.get("/info")).json()["pools"])

    admitted, answers = asyncio.run(scenario())
    assert server.process.wait(60) == 0, server.log()[-2000:]
    assert "Application shutdown complete" in server.log()
    # Every request the server admitted is answered with its embedding; none is cut off.
    errors = [answer for answer in answers if isinstance(answer, Exception)]
    assert not errors, errors
    assert {answer.status_code for answer in answers} <= {200, 429}
    assert sum(answer.status_code == 200 for answer in answers) >= admitted
    for answer in answers:
        if answer.status_code == 200:
            assert len(answer.json()[0]) == 384
