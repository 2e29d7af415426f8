"""The slow lane: a connection answered BUSY waits unread while the front end serves the others.

The lane on its own (a real asyncio loop, stepped one iteration at a time), the kernel's arrival
stamps on real sockets, then a real uvicorn on 127.0.0.1 with the front end's loop and protocol,
driven by raw sockets.
"""

from __future__ import annotations

import asyncio
import functools
import select
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from queue_manager.protocol import Busy
from tests.frontend.kernel_stamps import Transport, stamped_connection
from tests.servers import read_answers, uvicorn_in_thread
from windve.frontend import event_loop, http_protocol, metrics
from windve.frontend.gate import LATE, OverloadGate
from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol
from windve.frontend.pipeline import ARRIVED, GATE_PASS, LANE_WAIT, release_pass
from windve.frontend.slow_lane import SlowLane, peer_closed, waiting_since

# A stamp is turned into perf_counter time by reading two clocks one after the other: a
# preemption between the reads moves it earlier by as long, which a loaded machine can make
# long. The upper bounds are the tests' point and exact; the lower ones are a sanity check.
CLOCK_SLACK = 1.0

# ---- the lane alone ----------------------------------------------------------------------------


def one_step(loop: asyncio.AbstractEventLoop) -> None:
    """Run the callbacks ready now, as one iteration of the loop."""
    loop.call_soon(loop.stop)
    loop.run_forever()


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_the_lane_releases_what_the_answers_earn_oldest_first_and_per_step_at_most(loop):
    lane = SlowLane(loop, per_step=3, per_answer=2, floor=0)
    released: list[int] = []
    for i in range(10):
        lane.park(functools.partial(lambda i: released.append(i) or True, i))
    one_step(loop)
    assert released == []  # no answer given yet: nothing is read again
    lane.answered()
    one_step(loop)
    assert released == [0, 1]
    for _ in range(5):  # 10 releases earned, but one step reads at most per_step of them
        lane.answered()
    one_step(loop)
    assert released == [0, 1, 2, 3, 4]
    one_step(loop)
    assert released == [0, 1, 2, 3, 4]  # the credit does not pile up past per_step
    assert len(lane) == 5


def test_a_released_connection_with_nothing_waiting_uses_no_release(loop):
    lane = SlowLane(loop, per_step=4, per_answer=1, floor=0)
    released: list[str] = []

    def parked(name: str, waiting: bool):
        return lambda: released.append(name) or waiting

    for name, waiting in (("gone", False), ("idle", False), ("asking", True), ("next", True)):
        lane.park(parked(name, waiting))
    lane.answered()
    one_step(loop)
    assert released == ["gone", "idle", "asking"]  # one release, spent on the one that asked
    assert len(lane) == 1


def test_the_floor_releases_without_answers(loop):
    lane = SlowLane(loop, per_step=8, per_answer=1, floor=1000)
    seen = asyncio.Event()

    def release() -> bool:
        seen.set()
        return True

    lane.park(release)
    loop.run_until_complete(asyncio.wait_for(seen.wait(), 10))  # about a millisecond, by the floor's timer


# ---- the kernel's stamps -----------------------------------------------------------------------


@pytest.fixture
def connection():
    with stamped_connection() as pair:
        yield pair


def test_waiting_since_is_when_the_kernel_received_the_bytes_and_leaves_them_unread(connection):
    client, server = connection
    assert waiting_since(Transport(server), floor=0.0) is None  # nothing waits
    sent = time.perf_counter()
    client.sendall(b"GET /health HTTP/1.1\r\n\r\n")
    select.select([server], [], [], 10)
    read_late = time.perf_counter()
    arrived = waiting_since(Transport(server), floor=0.0)
    assert arrived is not None and sent - CLOCK_SLACK <= arrived <= read_late
    assert server.recv(100) == b"GET /health HTTP/1.1\r\n\r\n"  # peeked, not taken
    client.sendall(b"x")
    select.select([server], [], [], 10)
    never_later_than_now = waiting_since(Transport(server), floor=time.perf_counter() + 100)
    assert never_later_than_now <= time.perf_counter()


def test_peer_closed_reads_the_tcp_state(connection):
    client, server = connection
    assert not peer_closed(Transport(server))
    client.close()
    select.select([server], [], [], 10)  # the end of the stream is readable
    assert peer_closed(Transport(server))


# ---- the gate's passes -------------------------------------------------------------------------


class RoomDispatcher:
    """Room for `room` queries; the gate's promised passes count against it, as admission's would."""

    def __init__(self, room: int, tail: float | None = None) -> None:
        self.room = room
        self.tail = tail

    def status(self) -> dict:
        return {"status": "ok"}

    def check_room(self, wanted: int, promised: int = 0) -> None:
        if self.room - promised < wanted:
            raise Busy(retry_after=1.0)

    def live_tail(self) -> float | None:
        return self.tail


def gated_app(room: int, slo: float = 1.0):
    app = RecordingApp(RoomDispatcher(room))
    app.state.settings = SimpleNamespace(slo_seconds=slo, api_key=None)
    return app


def test_the_gate_lets_through_no_more_than_the_room_until_they_reach_their_room_check():
    gate = OverloadGate(gated_app(room=2))
    headers = [(b"content-length", b"10")]
    scopes = [{} for _ in range(4)]
    assert gate.refusal("/embed", headers, scopes[0]) is None
    assert gate.refusal("/embed", headers, scopes[1]) is None
    refused = gate.refusal("/embed", headers, scopes[2])
    assert refused is not None and refused.status == 429  # the room is promised to the first two
    release_pass(scopes[0])
    release_pass(scopes[0])  # idempotent
    assert gate.passes == 1
    assert gate.refusal("/embed", headers, scopes[3]) is None


@pytest.mark.parametrize(("tail", "budget"), [(None, 0.15), (0.6, 0.4), (0.9, 0.15), (1.4, 0.15)])
def test_a_parked_request_may_wait_what_the_slo_leaves_beyond_the_live_tail(tail, budget):
    # At least the SLO's headroom, which the depths leave for waits they do not see.
    app = gated_app(room=2)
    app.dispatcher.tail = tail
    assert OverloadGate(app).lane_budget() == pytest.approx(budget)


def test_a_pass_is_given_back_however_the_request_ends():
    class FailingApp(RecordingApp):
        async def __call__(self, scope, receive, send) -> None:
            raise RuntimeError("the handler failed")

    app = FailingApp(RoomDispatcher(room=1))
    app.state.settings = SimpleNamespace(slo_seconds=1.0, api_key=None)
    gate = OverloadGate(app)
    scope = {"type": "http", "method": "POST", "path": "/embed", "headers": [(b"content-length", b"2")]}
    with pytest.raises(RuntimeError):
        asyncio.run(gate(scope, None, None))
    assert GATE_PASS in scope and gate.passes == 0


# ---- through uvicorn ---------------------------------------------------------------------------


class RecordingApp:
    """Answers 200 to what reaches it, recording each request's arrival stamp."""

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher
        self.state = SimpleNamespace(runtime=SimpleNamespace(dispatcher=dispatcher), startup_error=None)
        self.seen: dict[bytes, dict] = {}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = (await receive())["body"]
        self.seen[body] = {"arrived": scope.get(ARRIVED), "lane_wait": scope.get(LANE_WAIT, False)}
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def served(monkeypatch):
    """uvicorn with the front end's loop, whose lane releases one connection per answer and none
    by the clock, nor for patience: what is read again follows from what the test does. A stamped connection
    beside it keeps the host's stamping on."""
    lane = functools.partial(SlowLane, per_step=8, per_answer=1, floor=0)
    monkeypatch.setattr(event_loop, "SlowLane", lane)
    monkeypatch.setattr(http_protocol, "PATIENCE", 3600.0)  # the tests of the patient wake set their own
    app = gated_app(room=0, slo=1000.0)
    with stamped_connection(), uvicorn_in_thread(OverloadGate(app), http=JsonErrorHttpToolsProtocol,
                                                 loop="windve.frontend.event_loop:new_event_loop") as (server, port):
        yield app, port, server


def post(body: bytes) -> bytes:
    return f"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


HEALTH = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The next response on the connection, which must not close before it."""
    ((status, headers, body),) = read_answers(sock, 1)
    return status, headers, body


def nothing_to_read(sock: socket.socket) -> bool:
    return not select.select([sock], [], [], 0)[0]


def park(port: int, server) -> socket.socket:
    """A connection answered BUSY once, so parked, with its next request waiting in its socket."""
    sock = refused_once(port, server)
    sock.sendall(post(b"waiting"))
    return sock


def refused_once(port: int, server) -> socket.socket:
    """A connection answered BUSY once, and parked."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(post(b"refused"))
    assert answer(sock)[0] == 429
    protocol = protocol_of(server, sock)
    until(lambda: protocol._parked, "the refused connection was parked")  # it is, right after writing the 429
    return sock


def protocol_of(server, sock: socket.socket) -> JsonErrorHttpToolsProtocol:
    """The server's protocol of the connection whose client end is `sock`."""
    (protocol,) = [p for p in server.server_state.connections if p.client == sock.getsockname()]
    return protocol


def until(condition, what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        time.sleep(0.005)  # polls the server's state: it has no event to wait on
    raise AssertionError(f"never: {what}")


def test_a_refused_connection_is_read_again_after_an_answer_and_counts_its_wait(served):
    app, port, server = served
    with park(port, server) as parked, socket.create_connection(("127.0.0.1", port), timeout=10) as other:
        sent = time.perf_counter()
        for _ in range(2):  # the second is read in a later loop step than the parked request's bytes
            other.sendall(HEALTH)
            assert answer(other)[0] == 200
        assert nothing_to_read(parked)  # not read: the lane has earned no release
        app.dispatcher.room = 1
        answered_at = time.perf_counter()
        other.sendall(post(b"admitted"))
        assert answer(other)[0] == 200  # an answer that was not a refusal earns one release
        assert answer(parked)[0] == 200
    waited = app.seen[b"waiting"]
    assert waited["lane_wait"]
    # Its time counts from when its bytes reached the socket, before the request that released it.
    assert waited["arrived"] < answered_at
    assert waited["arrived"] >= sent - 1.0
    assert not app.seen[b"admitted"]["lane_wait"]


def test_a_request_that_waited_parked_past_the_slos_headroom_is_busy_whatever_the_room(served):
    app, port, server = served
    app.state.settings.slo_seconds = 0.0  # a headroom of no time at all: any wait is too long
    late = metrics.LATE._value.get()
    with park(port, server) as parked, socket.create_connection(("127.0.0.1", port), timeout=10) as other:
        app.dispatcher.room = 1
        other.sendall(post(b"admitted"))
        assert answer(other)[0] == 200
        status, _, body = answer(parked)
    assert status == 429 and LATE.encode() in body
    assert metrics.LATE._value.get() == late + 1  # only the parked one was late
    assert b"waiting" not in app.seen


def test_shutdown_reads_and_answers_what_waits_in_a_parked_connection(served):
    app, port, server = served
    with park(port, server) as parked:
        server.should_exit = True
        status, headers, _ = answer(parked)
    assert status == 429 and headers["connection"] == "close"



def test_a_client_that_waits_out_retry_after_is_read_when_it_asks_again(served, monkeypatch):
    monkeypatch.setattr(http_protocol, "PATIENCE", 0.05)
    app, port, server = served
    with refused_once(port, server) as patient:
        protocol = protocol_of(server, patient)
        # Read again: its socket peeked (nothing waited) and reading resumed.
        until(lambda: not protocol._parked and not protocol.flow.read_paused, "the patient connection was read again")
        app.dispatcher.room = 1
        patient.sendall(post(b"after retry-after"))  # no answer has earned the lane a release
        assert answer(patient)[0] == 200
    assert not app.seen[b"after retry-after"]["lane_wait"]


def test_a_client_that_re_asked_at_once_stays_in_the_lane_past_retry_after(served):
    # The patience timer is the fixture's hour: the test runs the wake itself on the server's
    # loop once the request has waited longer than the lane's budget, however slow the machine.
    app, port, server = served
    app.state.settings.slo_seconds = 0.1  # a headroom of 15 ms
    budget = OverloadGate(app).lane_budget()
    with park(port, server) as parked:
        sent_by = time.perf_counter()  # the parked request's bytes were in its socket by then
        protocol = protocol_of(server, parked)
        until(lambda: time.perf_counter() - sent_by > 2 * budget, "the parked request waited past the budget")
        woken = threading.Event()
        seen: dict[str, object] = {}

        def wake() -> None:  # what the patience timer does when it runs
            try:
                since = waiting_since(protocol.transport, protocol._parked_at)
                seen["waited"] = None if since is None else time.perf_counter() - since
                seen["parks"] = protocol._parks
                protocol._patience.cancel()
                protocol._wake_if_patient()
                seen["after"] = (protocol._parked, protocol.flow.read_paused, protocol._patience)
            except BaseException as exc:
                seen["error"] = exc
            finally:
                woken.set()

        protocol.loop.call_soon_threadsafe(wake)
        assert woken.wait(10), "the server's loop did not run the wake"
        assert "error" not in seen, seen.get("error")
        assert seen["waited"] is not None and seen["waited"] > budget  # the case under test
        assert seen["after"] == (True, True, None)  # still parked, not read; the timer is spent
        # and later still: not read, so neither answered nor parked again
        assert protocol._parked and protocol._parks == seen["parks"]
        assert nothing_to_read(parked) and b"waiting" not in app.seen
