"""A request's time to answer counts from when its bytes arrived (the kernel's stamp), not from when
its parse began."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from tests.frontend.kernel_stamps import stamped_connection
from tests.servers import uvicorn_in_thread
from windve.frontend.event_loop import FrontEndLoop, new_event_loop
from windve.frontend.gate import OverloadGate
from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol
from windve.frontend.pipeline import ARRIVED

# A stamp is turned into perf_counter time by reading two clocks one after the other: a
# preemption between the reads moves it earlier by as long, which a loaded machine can make
# long. The upper bounds are the tests' point and exact; the lower ones are a sanity check.
CLOCK_SLACK = 1.0

STEP_WORK = 0.05  # seconds each room check takes: stands for a step's other requests
HOLD = 0.2  # seconds the loop stays busy after the test's requests arrived


class SlowDispatcher:
    """A room check holds the event loop while `hold` is set, until the test lets go; every other
    one works STEP_WORK seconds, as the refusals of a busy step do."""

    def __init__(self) -> None:
        self.hold, self.holding, self.release = threading.Event(), threading.Event(), threading.Event()

    def status(self) -> dict:
        return {"status": "ok"}

    def live_tail(self) -> float | None:
        return None

    def check_room(self, wanted: int, promised: int = 0) -> None:
        if self.hold.is_set():
            self.hold.clear()
            self.holding.set()
            assert self.release.wait(10), "the test never released the loop"
        else:
            time.sleep(STEP_WORK)


class ArrivalApp:
    def __init__(self) -> None:
        self.dispatcher = SlowDispatcher()
        self.state = SimpleNamespace(
            runtime=SimpleNamespace(dispatcher=self.dispatcher),
            startup_error=None,
            settings=SimpleNamespace(api_key=None),  # the gate lets a request without the key through
        )
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


def test_without_a_stamp_a_request_counts_from_its_steps_select():
    loop = new_event_loop()
    try:
        loop.run_until_complete(asyncio.sleep(0.01))
        assert loop.arrival(None) == loop.ready_at
        assert loop.arrival(12345) == loop.ready_at  # a descriptor nobody watches
    finally:
        loop.close()


def answered(sock: socket.socket, count: int = 1) -> None:
    data = b""
    while data.count(b"HTTP/1.1 200") < count:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection"
        data += chunk


def test_requests_count_from_when_their_bytes_arrived_while_the_loop_was_busy(served):
    app, port = served
    with contextlib.ExitStack() as stack:
        stack.enter_context(stamped_connection())  # skips where the kernel does not stamp TCP
        first, second, third = (
            stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10)) for _ in range(3)
        )
        for sock in (second, third):  # accepted and watched before the loop is held
            sock.sendall(post(b"warm"))
            answered(sock)
        app.dispatcher.hold.set()
        first.sendall(post(b"first"))
        assert app.dispatcher.holding.wait(10)  # the loop is inside the first request's step
        sent = time.perf_counter()
        second.sendall(post(b"second"))
        third.sendall(post(b"third"))
        sent_by = time.perf_counter()
        # The loop is busy for HOLD more: the two requests wait in their sockets for the select
        # that follows, then the third behind the second's STEP_WORK.
        time.sleep(HOLD)
        app.dispatcher.release.set()
        for sock in (first, second, third):
            answered(sock)
    (arrived_2, seen_2), (arrived_3, seen_3) = app.arrived[b"second"], app.arrived[b"third"]
    for arrived in (arrived_2, arrived_3):
        assert sent - CLOCK_SLACK <= arrived <= sent_by  # the kernel's stamp, not the select's time
    assert seen_2 - arrived_2 >= HOLD
    assert seen_3 - arrived_3 >= HOLD + STEP_WORK


def test_a_pipelined_request_behind_the_first_counts_from_its_steps_select(served):
    app, port = served
    with stamped_connection(), socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(post(b"warm"))
        answered(sock)
        app.dispatcher.hold.set()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as holder:
            holder.sendall(post(b"hold"))
            assert app.dispatcher.holding.wait(10)
            sent = time.perf_counter()
            sock.sendall(post(b"one") + post(b"two"))  # both in one read
            sent_by = time.perf_counter()
            time.sleep(HOLD)
            released = time.perf_counter()
            app.dispatcher.release.set()
            answered(holder)
        answered(sock, 2)
    # The stamp is of the first byte: the second request may have come later, and taking it for
    # both would overstate the second's wait.
    assert sent - CLOCK_SLACK <= app.arrived[b"one"][0] <= sent_by
    assert app.arrived[b"two"][0] >= released


# ---- a new connection's first request -----------------------------------------------------------


class CountingLoop(FrontEndLoop):
    """The front end's loop, counting its steps (selects)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0
        select = self._stamps.select

        def counted(timeout: float | None = None) -> list:
            self.steps += 1
            return select(timeout)

        self._stamps.select = counted
        self.accepted_at = -1

    def _accept_connection(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        self.accepted_at = self.steps
        return super()._accept_connection(*args, **kwargs)


def counting_loop() -> CountingLoop:
    return CountingLoop()


class StepNotingProtocol(JsonErrorHttpToolsProtocol):
    # The loop's step at the accept, at connection_made and at the request's parse.
    seen: list[tuple[int, int, int]] = []

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._accepted_at, self._made_at = self.loop.accepted_at, self.loop.steps
        super().connection_made(transport)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        StepNotingProtocol.seen.append((self._accepted_at, self._made_at, self.loop.steps))


def test_a_new_connections_first_request_already_in_its_socket_is_read_in_its_accepts_step():
    app = ArrivalApp()
    StepNotingProtocol.seen = []
    loop = f"{__name__}:counting_loop"
    with uvicorn_in_thread(OverloadGate(app), http=StepNotingProtocol, loop=loop) as (_, port):
        app.dispatcher.hold.set()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as holder:
            holder.sendall(post(b"hold"))
            assert app.dispatcher.holding.wait(10)
            # Connected and asked while the loop is held: the request is in the socket before
            # the loop accepts the connection.
            probe = socket.create_connection(("127.0.0.1", port), timeout=10)
            with probe:
                probe.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                app.dispatcher.release.set()
                answered(holder)
                assert probe.recv(4096).startswith(b"HTTP/1.1 200")
    accepted, made, parsed = StepNotingProtocol.seen[-1]
    # The transport made and started at the accept, not by a task a step later and its scheduled
    # start a step after that; its request read at once, not at the next select.
    assert made == accepted
    assert parsed == made


# ---- probes first in their step ---------------------------------------------------------------


class OrderNotingProtocol(JsonErrorHttpToolsProtocol):
    parsed: list[bytes] = []  # each request's path, in the order their headers were read

    def on_headers_complete(self) -> None:
        OrderNotingProtocol.parsed.append(self.url)
        super().on_headers_complete()


@pytest.mark.parametrize("new_connection", [False, True], ids=["kept-alive", "new connection"])
def test_a_health_probe_goes_first_in_its_loop_step(new_connection: bool):
    # A Kubernetes probe comes on a new connection each time: its accept (which reads its first
    # request) runs right after the kept-alive probes, where epoll reports it after the others.
    app = ArrivalApp()
    OrderNotingProtocol.parsed = []
    loop = "windve.frontend.event_loop:new_event_loop"
    with contextlib.ExitStack() as stack:
        _, port = stack.enter_context(uvicorn_in_thread(OverloadGate(app), http=OrderNotingProtocol, loop=loop))
        connect = lambda: stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))  # noqa: E731
        holder, *clients = (connect() for _ in range(4))
        poller = None if new_connection else connect()
        for sock in clients if poller is None else (poller, *clients):  # accepted and watched before the hold
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            answered(sock)
        OrderNotingProtocol.parsed.clear()
        app.dispatcher.hold.set()
        holder.sendall(post(b"hold"))
        assert app.dispatcher.holding.wait(10)
        # While the loop is held each client asks, then the poller: epoll reports them in that
        # order, and each request costs its step STEP_WORK.
        for sock in clients:
            sock.sendall(post(b"x"))
        poller = poller or connect()  # a new one is queued for accept, its request sent
        poller.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        app.dispatcher.release.set()
        for sock in (holder, poller, *clients):
            answered(sock)
    assert OrderNotingProtocol.parsed == [b"/embed", b"/health"] + [b"/embed"] * len(clients)
