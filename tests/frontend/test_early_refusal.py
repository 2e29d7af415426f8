"""BUSY answered by the HTTP protocol itself: the same bytes as the ASGI gate's, without a request task.

A real uvicorn on 127.0.0.1 serves an app whose dispatcher has no room (or, when the test says,
room); the client is a raw socket, so keep-alive, pipelining and HTTP/1.0 are the wire's own.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from types import SimpleNamespace

import pytest

from queue_manager.protocol import Busy, ShuttingDown
from tests.servers import asgi_body, read_answers, uvicorn_in_thread
from windve.frontend.gate import OverloadGate
from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol
from windve.frontend.pipeline import ARRIVED, refusal


class Dispatcher:
    def __init__(self) -> None:
        self.full: Exception | None = Busy(retry_after=2.4)
        self.health = "ok"

    def status(self) -> dict:
        return {"status": self.health}

    def live_tail(self) -> float | None:
        return None

    def check_room(self, wanted: int, promised: int = 0) -> None:
        if self.full is not None:
            raise self.full


class RecordingApp:
    """The app behind the gate: answers 200 and records every request that reached it."""

    def __init__(self) -> None:
        self.dispatcher = Dispatcher()
        runtime = SimpleNamespace(dispatcher=self.dispatcher)
        self.state = SimpleNamespace(runtime=runtime, startup_error=None, settings=SimpleNamespace(api_key=None))
        self.seen: list[str] = []
        self.arrived: list[float | None] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await asgi_body(receive)
        self.seen.append(scope["path"])
        self.arrived.append(scope.get(ARRIVED))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def served():
    app = RecordingApp()
    with uvicorn_in_thread(OverloadGate(app), http=JsonErrorHttpToolsProtocol, loop="asyncio") as (_, port):
        yield app, port


def post(path: str, body: bytes, version: str = "1.1") -> bytes:
    return (
        f"POST {path} HTTP/{version}\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


BODY = json.dumps({"inputs": "hello"}).encode()


def test_a_full_service_answers_busy_in_each_api_shape_and_keeps_the_connection(served):
    app, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # Two requests written at once (pipelined), then a third after: one connection throughout.
        sock.sendall(post("/embed", BODY) + post("/v1/embeddings", BODY))
        sock.sendall(post("/embed", BODY))
        answers = read_answers(sock, 3)
    assert [status for status, _, _ in answers] == [429, 429, 429]
    tei, openai = json.loads(answers[0][2]), json.loads(answers[1][2])
    assert tei == {"error": "model is overloaded: every queue is full", "error_type": "overloaded"}
    assert openai["error"]["type"] == "server_busy" and openai["error"]["code"] == "busy"
    for _, headers, _ in answers:
        assert headers["retry-after"] == "3"  # 2.4 s, in whole seconds up
        assert headers["content-type"] == "application/json"
        assert "date" in headers and "connection" not in headers
    assert app.seen == []  # no request reached the app


def test_the_same_connection_is_served_once_there_is_room(served):
    app, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(post("/embed", BODY))
        assert read_answers(sock, 1)[0][0] == 429
        app.dispatcher.full = None
        sock.sendall(post("/embed", BODY))
        assert read_answers(sock, 1)[0][:1] == (200,)
    assert app.seen == ["/embed"]
    # Stamped when the protocol began parsing it: the depth control counts the time from there.
    assert app.arrived[0] is not None and app.arrived[0] <= time.perf_counter()


def test_draining_and_http_1_0_close_as_they_should(served):
    app, port = served
    app.dispatcher.full = ShuttingDown(retry_after=1.0)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(post("/embed", BODY, version="1.0"))
        ((status, headers, body),) = read_answers(sock, 1)
        assert sock.recv(1) == b""  # closed after the answer
    assert status == 429 and headers["connection"] == "close"
    assert "shutting down" in json.loads(body)["error"]


def test_other_requests_and_large_bodies_go_the_normal_way(served):
    app, port = served
    big = json.dumps({"inputs": "x" * 70_000}).encode()  # over the gate's small-body bound
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(post("/tokenize", BODY) + post("/embed", big))
        statuses = [status for status, _, _ in read_answers(sock, 2)]
    assert statuses == [200, 200] and app.seen == ["/tokenize", "/embed"]


def test_without_the_api_key_a_request_goes_to_its_401_not_a_busy(served):
    # The app behind the gate here answers 200 to all: what reaches it is what the route would
    # answer 401. A client with the key still meets the full service's 429.
    app, port = served
    app.state.settings.api_key = "key"
    keyed = post("/embed", BODY).replace(b"Host: t\r\n", b"Host: t\r\nAuthorization: Bearer key\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(post("/embed", BODY))
        assert read_answers(sock, 1)[0][0] == 200
        sock.sendall(keyed)
        assert read_answers(sock, 1)[0][0] == 429
    assert app.seen == ["/embed"]


def test_the_asgi_gate_sends_the_same_bytes(served):
    # Without the protocol (another server, or a test client) the ASGI gate answers alike.
    app, _ = served
    gate = OverloadGate(app)
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": BODY}

    scope = {"type": "http", "method": "POST", "path": "/embed",
             "headers": [(b"content-length", str(len(BODY)).encode())]}  # fmt: skip
    asyncio.run(gate(scope, receive, send))
    assert sent[0]["status"] == 429 and dict(sent[0]["headers"])[b"retry-after"] == b"3"
    assert json.loads(sent[1]["body"])["error_type"] == "overloaded" and app.seen == []


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode()


def test_health_is_answered_by_the_protocol_as_the_route_would(served):
    app, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(get("/health") + get("/"))
        answers = read_answers(sock, 2)
        app.dispatcher.health = "unhealthy"
        sock.sendall(get("/health"))
        answers += read_answers(sock, 1)
        sock.sendall(get("/health", "HEAD"))
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(4096)
    assert [(status, json.loads(body)) for status, _, body in answers] == [
        (200, {"status": "ok"}), (200, {"status": "ok"}), (503, {"status": "unhealthy"})
    ]  # fmt: skip
    assert data.startswith(b"HTTP/1.1 503 ") and data.endswith(b"\r\n\r\n")  # HEAD: no body
    assert app.seen == []  # no request task, no app


class SlowApp(RecordingApp):
    """Answers after `hold` seconds: a handler longer than the keep-alive timeout."""

    hold = 1.5

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            await asyncio.sleep(self.hold)  # the handler's work, which outlasts the 1 s keep-alive timeout
        await super().__call__(scope, receive, send)


def test_a_request_pipelined_behind_an_early_health_answer_is_not_cut_off_by_keep_alive():
    """/health answered by the protocol armed uvicorn's keep-alive timer, and the POST parsed from
    the same bytes ran under it: the connection was closed under its handler, the answer lost."""
    app = SlowApp()
    app.dispatcher.full = None  # room
    gate = OverloadGate(app)
    with uvicorn_in_thread(gate, http=JsonErrorHttpToolsProtocol, loop="asyncio", timeout_keep_alive=1) as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
            client.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n" + post("/embed", BODY))
            answers = read_answers(client, 2)
    assert [status for status, _, _ in answers] == [200, 200], answers
    assert app.seen == ["/embed"]


def test_a_draining_service_closes_a_kept_alive_connection_after_its_429(served):
    """The dispatcher says draining before this front end has its SIGTERM (the board is published
    first): its 429s had kept HTTP/1.1 connections open, and their clients asked this replica again."""
    app, port = served
    app.dispatcher.full = ShuttingDown(retry_after=1.0)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(post("/embed", BODY))
        ((status, headers, _),) = read_answers(sock, 1)
        assert sock.recv(1) == b""  # closed after the answer
    assert status == 429 and headers["connection"] == "close"


def test_the_asgi_gates_shutting_down_answer_closes_too():
    error = refusal(ShuttingDown(retry_after=1.0))
    for path in ("/embed", "/v1/embeddings"):
        assert error.response_for(path).headers["connection"] == "close"
    assert "connection" not in refusal(Busy(retry_after=1.0)).response_for("/embed").headers


def test_a_refusal_made_here_carries_the_cors_headers_of_its_own_request(served):
    # A browser script reads no answer without them, a 429 included; each pipelined request gets
    # those of its own Origin.
    app, port = served
    app.state.settings.cors_allow_origins = ["https://app.example"]
    allowed = post("/embed", BODY).replace(b"Host: t\r\n", b"Host: t\r\nOrigin: https://app.example\r\n")
    other = post("/embed", BODY).replace(b"Host: t\r\n", b"Host: t\r\nOrigin: https://other.example\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(allowed + other + post("/embed", BODY))
        answers = read_answers(sock, 3)
    assert [status for status, _, _ in answers] == [429, 429, 429]
    first, second, third = (headers for _, headers, _ in answers)
    assert first["access-control-allow-origin"] == "https://app.example" and first["vary"] == "origin"
    assert first["access-control-expose-headers"] == "retry-after"
    assert "access-control-allow-origin" not in second and "access-control-allow-origin" not in third
    assert app.seen == []


def test_an_error_after_an_answered_request_carries_none_of_its_cors_headers(served):
    # The next request on the connection is not the browser's call that was allowed.
    app, port = served
    app.dispatcher.full = None
    app.state.settings.cors_allow_origins = ["*"]
    allowed = post("/embed", BODY).replace(b"Host: t\r\n", b"Host: t\r\nOrigin: https://app.example\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(allowed)
        ((status, headers, _),) = read_answers(sock, 1)
        assert status == 200 and headers["access-control-allow-origin"] == "*"
        sock.sendall(b"NOT-A-METHOD / HTTP/1.1\r\nHost: t\r\n\r\n")
        ((status, headers, _),) = read_answers(sock, 1)
    assert status == 400 and "access-control-allow-origin" not in headers
