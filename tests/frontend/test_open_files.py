"""Descriptors: `windve serve` raises its open-file limit, and a front end out of descriptors
pauses its accepts rather than spinning on them.

A host's soft limit is often 1,024 with a far higher hard one: at that soft limit a front end
stopped accepting at ~1,000 clients, and asyncio's accept, which reports the error and schedules a
resume for each of the backlog's tries in every step, wrote 71 MB of tracebacks in 8 s. Real parts:
`windve serve` on 127.0.0.1, the front end's own event loop in a process of its own.
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import textwrap

import httpx
import pytest

from tests.servers import start_server

SERVER = textwrap.dedent("""
    import asyncio, logging, resource, sys
    from windve.frontend.event_loop import FrontEndLoop

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")

    class Hello(asyncio.Protocol):
        def connection_made(self, transport):
            transport.write(b"hi")
            self.transport = transport

        def data_received(self, data):
            self.transport.close()

    async def main():
        server = await asyncio.get_running_loop().create_server(Hello, "127.0.0.1", 0, backlog=4096)
        resource.setrlimit(resource.RLIMIT_NOFILE, (__LIMIT__, __LIMIT__))
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes it

    loop = FrontEndLoop()
    loop.run_until_complete(main())
""")
LIMIT = 48


def _limits(pid: int) -> tuple[int, int]:
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-file limit in /proc/{pid}/limits")


def test_a_front_end_out_of_descriptors_pauses_its_accepts_and_says_so_once(tmp_path) -> None:
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("w") as stderr:
        script = SERVER.replace("__LIMIT__", str(LIMIT))
        server = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=stderr, text=True)
    clients: list[socket.socket] = []
    try:
        port = int(server.stdout.readline())
        # Twice as many clients as it has descriptors: those it accepts say hi, the rest wait.
        clients = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2 * LIMIT)]
        for client in clients[: LIMIT // 2]:  # well under the limit: every one is accepted
            assert client.recv(2) == b"hi"
        # The last client is not accepted while the first ones hold the descriptors: its wait
        # spans several pauses of a second (its read times out).
        clients[-1].settimeout(3.5)
        with pytest.raises(TimeoutError):
            clients[-1].recv(2)
        for client in clients[:-1]:
            client.close()
        # Freed descriptors: the pause ends and the waiting clients are accepted, the last among them.
        clients[-1].settimeout(30)
        assert clients[-1].recv(2) == b"hi"
    finally:
        for client in clients:
            client.close()
        server.stdin.close()
        server.wait(timeout=30)
    log = stderr_path.read_text()
    assert log.count("cannot accept connections") == 1, log[:2000]
    assert "Too many open files" in log and "raise the open-file limit" in log
    assert "Traceback" not in log and len(log.splitlines()) == 1, log[:2000]


def test_serve_raises_its_open_file_limit_to_the_hard_one_in_every_process(tmp_path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"this machine's hard open-file limit is {hard}: nothing to raise a soft 256 to")
    server = start_server(tmp_path, "--http-workers", "2", "--cpu-depth", "4", open_files=(256, hard))
    try:
        info = httpx.get(server.url + "/info", timeout=30).json()
        front_ends = info["dispatcher"]["front_ends"]
        assert len(front_ends) == 2
        for pid in [server.process.pid, *front_ends]:
            assert _limits(pid) == (hard, hard), pid
    finally:
        server.stop()
