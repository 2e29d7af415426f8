"""A client that stops reading its answers loses the connection, not the front end its memory;
one that reads slowly keeps it. A real uvicorn on 127.0.0.1 with WindVE's HTTP protocol, and raw
sockets whose receive buffers are small, so that the answer waits in the server's transport."""

from __future__ import annotations

import socket
import time

import pytest

from tests.servers import uvicorn_in_thread, wait_for
from windve.frontend import head_limits
from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol

ANSWER = 16 * 1024 * 1024  # far past what the kernel's socket buffers hold


async def big_answer(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(ANSWER).encode())]})
    await send({"type": "http.response.body", "body": b"x" * ANSWER})


@pytest.fixture
def served(monkeypatch):
    monkeypatch.setattr(head_limits, "SEND_IDLE_SECONDS", 0.5)
    with uvicorn_in_thread(big_answer, http=JsonErrorHttpToolsProtocol, loop="asyncio") as (server, port):
        yield server, port


def ask(port: int, receive_buffer: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    return sock


def read_all(sock: socket.socket, pause: float = 0.0) -> int:
    """Bytes read until the server closes or resets; `pause` between reads: a slow client."""
    got = 0
    try:
        while chunk := sock.recv(256 * 1024):
            got += len(chunk)
            if got >= ANSWER:
                break
            time.sleep(pause)  # the client's own pace, not a wait for the server
    except ConnectionResetError:
        pass
    return got


def test_a_client_that_reads_nothing_loses_its_connection_and_its_answer(served):
    server, port = served
    with ask(port, 4096) as sock:
        wait_for(lambda: len(server.server_state.connections) == 1, "the connection", 30)
        # What the client never reads is dropped with the connection, not kept for as long as it stays.
        wait_for(lambda: not server.server_state.connections, "the stalled connection to be closed", 30)
        assert read_all(sock) < ANSWER


def test_a_client_that_reads_slowly_gets_its_whole_answer(served):
    server, port = served
    with ask(port, 256 * 1024) as sock:
        # ~64 reads of 256 KiB, 0.05 s apart: several times the 0.5 s bound in all, never idle that long.
        assert read_all(sock, pause=0.05) >= ANSWER
