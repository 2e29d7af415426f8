"""An answer leaves the front end in one write: its head with the first part of its body.

uvicorn writes the head and the body apart, and with TCP_NODELAY each write is a send() and a
segment of its own (windve/frontend/one_write.py). Served here by uvicorn with the service's
protocol and event loop on 127.0.0.1; the writes counted are those each connection's transport
was asked for, the bytes are what the client read."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn

from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol
from windve.listeners import listen


class CountedWrites(JsonErrorHttpToolsProtocol):
    writes: list[bytes] = []

    def connection_made(self, transport) -> None:  # type: ignore[override]
        write = transport.write

        def counted(data: bytes) -> None:
            CountedWrites.writes.append(bytes(data))
            write(data)

        transport.write = counted
        super().connection_made(transport)


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/echo":  # reads the body first: a client that sent `Expect: 100-continue` waits for the 100
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        length = str(len(body)).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", length)]})
        await send({"type": "http.response.body", "body": body})
    elif path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await send({"type": "http.response.body", "body": b"second", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/fails":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        raise RuntimeError("the app failed after its head")
    else:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def port():
    listener = listen("127.0.0.1", 0)
    config = uvicorn.Config(
        app,
        http=CountedWrites,
        loop="windve.frontend.event_loop:new_event_loop",
        lifespan="off",
        log_level="critical",
        fd=listener.fileno(),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        threading.Event().wait(0.01)  # uvicorn offers no start event to wait on
    assert server.started
    yield listener.getsockname()[1]
    server.should_exit = True
    thread.join(10)
    listener.close()


def _exchange(port: int, request: bytes, until: bytes, *, then: bytes | None = None) -> bytes:
    """Send `request`, read until the answer holds `until` (or the server closes); with `then`, send
    it once the answer so far holds `HTTP/1.1 100`."""
    CountedWrites.writes.clear()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(request)
        answer = b""
        while until not in answer:
            if then is not None and b"HTTP/1.1 100" in answer:
                client.sendall(then)
                then = None
            part = client.recv(65536)
            if not part:
                break
            answer += part
    return answer


def _one_answer_per_write(writes: list[bytes]) -> None:
    for write in writes:
        assert write.startswith(b"HTTP/1.1 ") and write.count(b"HTTP/1.1 ") == 1, writes


def test_a_head_and_its_body_go_in_one_write(port):
    answer = _exchange(port, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", b"\r\n\r\nok")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\nok")
    assert len(CountedWrites.writes) == 1 and CountedWrites.writes[0] == answer


def test_pipelined_requests_get_one_write_each_in_order(port):
    CountedWrites.writes.clear()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n" * 3)
        answer = b""
        while answer.count(b"\r\n\r\nok") < 3:
            part = client.recv(65536)
            if not part:
                break
            answer += part
    assert answer.count(b"HTTP/1.1 200") == 3
    assert len(CountedWrites.writes) == 3 and b"".join(CountedWrites.writes) == answer
    _one_answer_per_write(CountedWrites.writes)


def test_a_head_request_sends_its_head(port):
    answer = _exchange(port, b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n", b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n")
    assert CountedWrites.writes == [answer]


def test_a_100_continue_goes_at_once_and_the_answer_in_one_write(port):
    request = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    answer = _exchange(port, request, b"\r\n\r\nhello", then=b"hello")
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200")
    assert CountedWrites.writes[0] == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert len(CountedWrites.writes) == 2 and CountedWrites.writes[1].endswith(b"\r\n\r\nhello")


def test_a_streamed_answer_carries_its_head_with_the_first_chunk(port):
    answer = _exchange(port, b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n", b"0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and b"\r\n\r\n5\r\nfirst\r\n6\r\nsecond\r\n0\r\n\r\n" in answer
    first, *rest = CountedWrites.writes
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"5\r\nfirst\r\n")
    assert b"".join(rest) == b"6\r\nsecond\r\n0\r\n\r\n"


def test_an_app_failing_after_its_head_still_sends_the_head_and_closes(port):
    answer = _exchange(port, b"GET /fails HTTP/1.1\r\nHost: t\r\n\r\n", b"never in an answer")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n")  # as uvicorn alone sends it
    assert CountedWrites.writes == [answer]
