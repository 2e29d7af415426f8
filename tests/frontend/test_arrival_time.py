"""A request's time to answer counts from when its socket was ready, not from when its parse began."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from tests.servers import uvicorn_in_thread
from windve.frontend.event_loop import FrontEndLoop, new_event_loop
from windve.frontend.gate import OverloadGate
from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol
from windve.frontend.pipeline import ARRIVED

STEP_WORK = 0.05  # seconds each room check takes: stands for a step's other requests


class SlowDispatcher:
    """The first room check holds the event loop until the test lets go; every later one works
    STEP_WORK seconds, as the refusals of a busy step do."""

    def __init__(self) -> None:
        self.holding, self.release = threading.Event(), threading.Event()
        self.calls = 0

    def status(self) -> dict:
        return {"status": "ok"}

    def check_room(self, wanted: int, promised: int = 0) -> None:
        self.calls += 1
        if self.calls == 1:
            self.holding.set()
            assert self.release.wait(10), "the test never released the loop"
        else:
            time.sleep(STEP_WORK)


class ArrivalApp:
    def __init__(self) -> None:
        self.dispatcher = SlowDispatcher()
        self.state = SimpleNamespace(runtime=SimpleNamespace(dispatcher=self.dispatcher), startup_error=None)
        self.arrived: dict[bytes, tuple[float, float]] = {}  # body -> (ARRIVED, when the app saw it)

    async def __call__(self, scope, receive, send) -> None:
        body = (await receive())["body"]
        self.arrived[body] = (scope[ARRIVED], time.perf_counter())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def served():
    app = ArrivalApp()
    loop = "windve.frontend.event_loop:new_event_loop"
    with uvicorn_in_thread(OverloadGate(app), http=JsonErrorHttpToolsProtocol, loop=loop) as (_, port):
        yield app, port


def post(body: bytes) -> bytes:
    return f"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def test_the_front_end_loop_notes_when_each_steps_sockets_were_ready():
    loop = new_event_loop()
    assert isinstance(loop, FrontEndLoop)
    try:
        before = time.perf_counter()
        loop.run_until_complete(asyncio.sleep(0.01))
        assert before < loop.ready_at <= time.perf_counter()
    finally:
        loop.close()


def test_requests_read_in_one_step_count_from_that_steps_ready_time(served):
    app, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as first:
        first.sendall(post(b"first"))
        assert app.dispatcher.holding.wait(10)  # the loop is inside the first request's step
        # Both become ready while the loop is held, so one step reads them; the one read second
        # waits behind the other's STEP_WORK, which its parse time alone would not count.
        second = socket.create_connection(("127.0.0.1", port), timeout=10)
        third = socket.create_connection(("127.0.0.1", port), timeout=10)
        with second, third:
            second.sendall(post(b"second"))
            third.sendall(post(b"third"))
            app.dispatcher.release.set()
            for sock in (first, second, third):
                assert sock.recv(1024).startswith(b"HTTP/1.1 200")
    (arrived_2, seen_2), (arrived_3, seen_3) = app.arrived[b"second"], app.arrived[b"third"]
    assert arrived_2 == arrived_3  # the same step's ready time
    assert max(seen_2 - arrived_2, seen_3 - arrived_3) >= 2 * STEP_WORK  # the later one's wait is counted
    assert app.arrived[b"first"][0] < arrived_2
