"""uvicorn's httptools protocol, answering the requests its parser refuses in JSON.

A request the HTTP parser cannot read never reaches the app: uvicorn answers it with a plain-text
400 "Invalid HTTP request received.". A `Content-Length` past 2^64 (llhttp: "Content-Length
overflow") is one: it is answered here as the 413 the app gives any body over its limit, and the
others as a 400, both in the shape of the API the request's path belongs to.

It also answers /health itself, from the dispatcher's state and without a request task, so that a
probe waits for no more than the event loop's current turn.

And it answers BUSY itself. Under a storm of clients that re-ask at once, most requests are
refusals, and each one that goes through a request task, the ASGI stack and a fresh Response
costs the event loop about twice what the refusal needs; the loop that also delivers the
admitted requests' answers then falls behind by a whole turn of refusals. When the overload
gate (gate.py) says there is no room, the request is answered here, from a cache of rendered
refusals, as soon as its body has been read, without a task.

A connection answered BUSY here, or by the app, then waits in the loop's slow lane (slow_lane.py)
before its next request is read, where the loop is the front end's (event_loop.py).

Serve with `uvicorn.Config(app, http=JsonErrorHttpToolsProtocol)` (or the import string
"windve.frontend.http_protocol:JsonErrorHttpToolsProtocol" where uvicorn starts workers itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import math
import socket
import struct
import sys
import termios
import time
from http import HTTPStatus

import httptools
from starlette.responses import Response
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from windve.frontend.arrival_stamps import stamp_arrivals
from windve.frontend.cors import policy_of
from windve.frontend.errors import MALFORMED, TOO_LARGE, ApiError, json_response
from windve.frontend.gate import OverloadGate
from windve.frontend.head_limits import (
    BODY_IDLE_SECONDS,
    HEAD_SECONDS,
    MAX_HEAD_BYTES,
    BodyTimer,
    HeadGuard,
    SendTimer,
)
from windve.frontend.one_write import OneWriteTransport
from windve.frontend.pipeline import ARRIVED, BUSY_ANSWERED, LANE_WAIT, release_pass
from windve.frontend.routes import HEALTH_PATHS, health_answer
from windve.frontend.slow_lane import PATIENCE, peer_closed, waiting_since

SHUTDOWN_GRACE = 1.0  # seconds an idle connection stays open once shutdown begins


class JsonErrorHttpToolsProtocol(HttpToolsProtocol):
    # (head, body, keep-alive, a refusal) of an answer to send once the request is read: a
    # refusal, or /health's.
    _refused: tuple[bytes, bytes, bool, bool] | None = None
    _shutting_down = False
    _parked = False  # not read, waiting in the slow lane
    _parked_at = 0.0
    _parks = 0  # times parked: a lane entry releases only the park it was made for
    _patience: asyncio.TimerHandle | None = None
    _waited_since: float | None = None  # when the request read next arrived, if it waited parked
    _watched: int | None = None  # this connection's key for the loop's arrival stamps (event_loop.py)
    # Bytes of the body of a request that asked to upgrade, still to come past the parser (_ignore_upgrade).
    _upgrade_body = 0
    _cors: list[tuple[bytes, bytes]] = []  # the CORS headers of the answer to the request being read (cors.py)
    _last_read: RequestResponseCycle | None = None  # the last request read whole: its answer is the last owed
    # (head, body) of an answer that closes the connection, held until the answers owed before it are sent
    _last_words: tuple[bytes, bytes] | None = None

    def shutdown(self) -> None:
        """The server's graceful shutdown: uvicorn closes an idle keep-alive connection at once, and a
        request already in its socket, not yet read, is then reset (a client saw "Connection reset by
        peer" during a SIGTERM drain). An idle connection stays open for SHUTDOWN_GRACE instead; what
        arrives meanwhile is answered, by a draining service, with `connection: close`."""
        if self.cycle is None or self.cycle.response_complete:
            self._shutting_down = True
            self._release()  # a request waiting in its socket is read and answered, draining
            # Then uvicorn's own: close if still idle, else let the answer in progress close it.
            self.loop.call_later(SHUTDOWN_GRACE, super().shutdown)
        else:
            super().shutdown()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        _no_delay(transport)
        self._head = HeadGuard(self.loop, self._head_timed_out)
        self._head.begin()
        self._body = BodyTimer(self.loop, self._body_timed_out)
        self._send = SendTimer(self.loop, self._send_timed_out, functools.partial(_unsent, transport))
        if getattr(self.server_state, "draining", False):  # accepted while the server drains (server.py)
            self._shutting_down = True
        stamp_arrivals(transport)
        if (watch := getattr(self.loop, "watch_arrivals", None)) is not None:
            self._watched = watch(transport)
            self._read_now()

    def _read_now(self) -> None:
        """Read a new connection's first request now if it is already in the socket, as it mostly
        is: this runs at the accept (event_loop.py), and the socket's reader reports it only at the
        next select. Under load each step is a sweep of every ready socket, and a readiness probe,
        on a new connection each time, waited one more for its answer (bench/SERVED.md). Nothing
        there (EAGAIN): the reader reads it when it comes."""
        read = getattr(self.transport, "_read_ready", None)  # the transport's reader callback
        if read is not None and not self.transport.is_closing():
            read()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head.done()
        self._body.done()
        self._send.done()
        if (unwatch := getattr(self.loop, "unwatch_arrivals", None)) is not None:
            unwatch(self._watched)
            self._watched = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if (beat := getattr(self.loop, "beat", None)) is not None:
            beat.progress()  # the loop reads: slow maybe, not stalled (windve.heartbeat)
        if self._last_words is not None:
            return  # past a request that could not be read, nothing can be read reliably
        heads = self._head.heads
        if self._upgrade_body:
            data = self._upgrade_body_part(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade as upgrade:
            self._ignore_upgrade()
            rest = data[upgrade.args[0] :]
            if rest and not self.transport.is_closing():
                self.data_received(rest)
                return
        self._body.read_over()
        if self._head.read(len(data), heads) and not self.transport.is_closing():
            self._refuse_head(431, f"the request's line and headers exceed {MAX_HEAD_BYTES} bytes")
            return
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not cycle.response_complete:
            # The rest of its body is the client's to send, maybe never: the gate's pass (taken at
            # the headers) must not hold room meanwhile. Clients that sent only the head of a POST
            # had made the service answer 429 to everyone while its pool stood idle.
            release_pass(cycle.scope)

    def _ignore_upgrade(self) -> None:
        """Serve a request that asked to upgrade the connection (`Upgrade: h2c`, as `curl --http2`
        sends over http://, or websocket) over HTTP/1.1, as a server that upgrades to nothing may
        (RFC 9110 7.8) and TEI's does. httptools has its parser skip such a request's body and
        stop after its head: uvicorn then served the request with an empty body (422) and dropped
        what was pipelined behind it. A new parser reads on, after the body, which
        `_upgrade_body_part` hands to the request."""
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # as uvicorn sets its own, where httptools can
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)

    def _upgrade_body_part(self, data: bytes) -> bytes:
        """Of `data`, hand the upgrade-asking request its body's next bytes; what is left after."""
        part, data = data[: self._upgrade_body], data[self._upgrade_body :]
        self._upgrade_body -= len(part)
        if part:
            self.on_body(part)
        if not self._upgrade_body:
            self.on_message_complete()
        return data

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # A request begins: the keep-alive timer an answer made here armed (on_message_complete)
        # no longer applies. A request pipelined behind an early /health ran under it, and the
        # connection was closed under its handler 5 s on.
        self._unset_keepalive_if_required()
        self._head.begin()
        self._cors = []  # until its headers are in: an error answered before then is no browser's to read
        # When its bytes arrived, where the loop is the front end's (event_loop.py): this request
        # may have waited for the select and behind the step's other sockets, which the parse
        # time would leave out.
        arrival = getattr(self.loop, "arrival", None)
        arrived = time.perf_counter() if arrival is None else arrival(self._watched)
        if self._waited_since is not None:  # it waited in its socket while the connection was parked
            arrived = min(arrived, self._waited_since)
            self.scope[LANE_WAIT] = True  # type: ignore[literal-required]
            self._waited_since = None
        self.scope[ARRIVED] = arrived  # type: ignore[literal-required]

    def on_headers_complete(self) -> None:
        self._head.done()
        self._body.progress()  # until on_message_complete: a request without a body ends at once
        gate = _gate_of(self.app)
        policy = None if gate is None else policy_of(gate.state.settings)
        self._cors = [] if policy is None else policy.answer_headers(self.headers)
        if self._head_too_large() or (self.parser.should_upgrade() and self._upgrade_refused()):
            return
        if not (self._health_early() or self._refuse_early()):
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope:  # this request's
                if self._shutting_down:
                    cycle.keep_alive = False
                if self._cors:  # sent with whatever the app answers, an error or a refusal too
                    cycle.default_headers = [*cycle.default_headers, *self._cors]
                cycle.transport = OneWriteTransport(cycle.transport, cycle)

    def _head_too_large(self) -> bool:
        """A head over MAX_HEAD_BYTES that came whole: 431. HeadGuard counts reads from the one
        after a head's first, so that a head that never ends is cut off; one that came in a read
        or two passed it by up to a read (256 KiB). Counted as sent: the target, and each header's
        name, value, ': ' and CRLF."""
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size <= MAX_HEAD_BYTES:
            return False
        self._refuse_when_read(431, f"the request's line and headers exceed {MAX_HEAD_BYTES} bytes")
        return True

    def _upgrade_refused(self) -> bool:
        """A request asking to upgrade: its body, which the parser will skip, is passed by hand
        (_ignore_upgrade); one sent chunked is refused, and its connection closed."""
        if self.parser.get_method() == b"CONNECT":
            return False  # no body; answered 405, as any method no route serves
        headers = dict(self.headers)
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            self._refuse_when_read(
                400, "a request asking to upgrade the connection must send its body with Content-Length"
            )
            return True
        self._upgrade_body = int(headers.get(b"content-length", b"0"))  # the parser checked it
        return False

    def _refuse_when_read(self, status: int, message: str) -> None:
        """Answer the request `status` once it is read (on_message_complete), and close."""
        self._refused = (*_rendered(status, message, MALFORMED, None, _path(self.url)), False, False)

    def _health_early(self) -> bool:
        method = self.parser.get_method()
        if method not in (b"GET", b"HEAD") or _path(self.url) not in HEALTH_PATHS or not self._may_answer_early():
            return False
        gate = _gate_of(self.app)
        if gate is None:
            return False
        response = json_response(*health_answer(gate.state))
        body = b"" if method == b"HEAD" else response.body
        self._refused = (_status_and_headers(response), body, self._keep_alive(), False)
        return True

    def _keep_alive(self) -> bool:
        return not self._shutting_down and self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()

    def _may_answer_early(self) -> bool:
        # A pipelined request behind one still running: the normal queue keeps the order.
        running = self.cycle is not None and not self.cycle.response_complete
        return not (running or self.expect_100_continue or self.parser.should_upgrade())

    def _refuse_early(self) -> bool:
        if self.parser.get_method() != b"POST" or not self._may_answer_early():
            return False
        gate = _gate_of(self.app)
        if gate is None:
            return False
        path = _path(self.url)
        error = gate.refusal(path, self.headers, self.scope)
        if error is None:
            return False
        # Retry-After is whole seconds on the wire: key the cache by what is sent.
        retry = None if error.retry_after is None else max(1, math.ceil(error.retry_after))
        rendered = _rendered(error.status, error.message, error.error_type, retry, path)
        keep_alive = self._keep_alive() and "Connection" not in error.extra_headers  # _write says close
        self._refused = (*rendered, keep_alive, True)
        return True

    def on_body(self, body: bytes) -> None:
        self._body.progress()
        if self._refused is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._upgrade_body:  # the parser skipped the body: complete once it is passed on
            return
        self._body.done()
        if self._refused is None:
            super().on_message_complete()
            self._last_read = self.cycle
            return
        head, body, keep_alive, refused = self._refused
        self._refused = None
        if self.transport.is_closing():
            return
        if not keep_alive:
            self._close_with(head, body)
            if self._last_words is not None:
                return  # sent after the answers owed before it (on_response_complete)
        else:
            self._write(head, body, keep_alive)
        self.on_response_complete()  # uvicorn's own bookkeeping: pipelined requests, keep-alive timer
        if refused and keep_alive:
            self._park()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._last_words is not None and not self._answers_owed() and not self.transport.is_closing():
            head, body = self._last_words
            self._last_words = None
            self._write(head, body, keep_alive=False)
            return
        # An answer made here (a refusal, /health) is handled by on_message_complete: its request's
        # scope is not the cycle's.
        cycle = self.cycle
        if cycle is None or cycle.scope is not self.scope:
            return
        if cycle.scope.get(BUSY_ANSWERED):  # the room check after the gate, or the ASGI gate, said BUSY
            if cycle.keep_alive:
                self._park()
        elif (lane := getattr(self.loop, "slow_lane", None)) is not None:
            lane.answered()

    def _park(self) -> None:
        """Stop reading this connection until the loop's slow lane releases it (slow_lane.py)."""
        lane = getattr(self.loop, "slow_lane", None)
        if lane is None or self._parked or self._shutting_down or self.pipeline or self.transport.is_closing():
            return
        # Its keep-alive timer would close it while parked, with a request unread in its socket.
        self._unset_keepalive_if_required()
        self.flow.pause_reading()
        self._parked = True
        self._parks += 1
        self._parked_at = time.perf_counter()
        lane.park(functools.partial(self._release, self._parks))
        # A client that honours the 429's Retry-After asks again about then: be reading when it does.
        self._patience = self.loop.call_later(PATIENCE, self._wake_if_patient)

    def _wake_if_patient(self) -> None:
        """Read again a parked connection whose client has not asked again yet, or asked only
        just now, so that its request is read when it comes. One whose request has waited since
        the 429 (a client that re-asks at once) stays in the lane: read, it would be answered
        429 for having waited too long, and the lane paces that."""
        self._patience = None
        if not self._parked or self.transport.is_closing():
            return
        since = waiting_since(self.transport, self._parked_at)
        gate = _gate_of(self.app)
        if since is None or (gate is not None and time.perf_counter() - since <= gate.lane_budget()):
            self._unpark(None)
            self._resume(since)  # what this peek saw: a request arriving after it is read at once

    def _release(self, park: int | None = None) -> bool:
        """Read this connection again (if `park` is given, only while parked by that park);
        whether a request was waiting in its socket."""
        return self._unpark(park) and self._resume(waiting_since(self.transport, self._parked_at))

    def _unpark(self, park: int | None) -> bool:
        """Leave the lane (if `park` is given, only the park it names); whether the connection is
        still there to read."""
        if not self._parked or (park is not None and park != self._parks):
            return False
        self._parked = False
        if self._patience is not None:
            self._patience.cancel()
            self._patience = None
        return not self.transport.is_closing()

    def _resume(self, waited_since: float | None) -> bool:
        """Read again; `waited_since`: when the request waiting in the socket arrived (None: none
        waits). Whether a client waits for that request's answer."""
        self._waited_since = waited_since
        self.flow.resume_reading()
        idle = self.cycle is None or self.cycle.response_complete
        if idle and self.timeout_keep_alive_task is None:
            timer = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)
            self.timeout_keep_alive_task = timer
        # A client that has gone (it timed out and closed) costs a read, but it is not a client
        # waiting for its answer: the ones behind it are released in the same step.
        return waited_since is not None and not peer_closed(self.transport)

    def _head_timed_out(self) -> None:
        """No complete head within HEAD_SECONDS: 408 for a request begun, a silent close for none."""
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._head.begin()  # a head pipelined behind a request still answered: its time starts after
            return
        if self._head.received or getattr(self, "url", b""):
            self._refuse_head(408, f"the request's line and headers did not arrive within {HEAD_SECONDS:g} s")
        else:
            self.transport.close()

    def _body_timed_out(self) -> None:
        """A body stopped coming: 408 and close, or only close where an answer has begun (the app
        answered without reading the whole body)."""
        if self.transport.is_closing():
            return
        self._refused = None  # an early refusal waits for the body's end, which is not coming
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()
        else:
            self._refuse_head(408, f"the request's body stopped arriving: nothing of it for {BODY_IDLE_SECONDS:g} s")

    def pause_writing(self) -> None:
        super().pause_writing()
        self._send.paused()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._send.done()

    def _send_timed_out(self) -> None:
        """The client took nothing of its answers for SEND_IDLE_SECONDS: drop them and the
        connection (a close would wait for them to be taken)."""
        self.transport.abort()

    def _refuse_head(self, status: int, message: str) -> None:
        response = ApiError(status, message, MALFORMED).response_for(_path(getattr(self, "url", b"") or b"/"))
        self._close_with(_status_and_headers(response), response.body)

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this while handling the parser's exception, which says what was wrong.
        response = parse_error(sys.exception(), msg).response_for(_path(self.url))
        self._close_with(_status_and_headers(response), response.body)

    def _close_with(self, head: bytes, body: bytes) -> None:
        """Answer the request being read and close the connection, after the answers still owed to
        the requests read before it (pipelined): written at once, the close cut them off, and a
        valid request lost its answer to a malformed one sent behind it."""
        if not self._answers_owed():
            self._write(head, body, keep_alive=False)
            return
        self._last_words = (head, body)
        self._head.done()
        self._body.done()
        self.flow.pause_reading()
        # This request, if its head was read, waits in the pipeline: it is not to be run.
        refused = self.cycle
        if refused is not self._last_read:
            for entry in [entry for entry in self.pipeline if entry[0] is refused]:
                self.pipeline.remove(entry)

    def _answers_owed(self) -> bool:
        """Whether a request read whole before the one being read still waits for its answer
        (answers complete in order: the last one read is the last owed)."""
        last = self._last_read
        return last is not None and not last.response_complete

    def _write(self, head: bytes, body: bytes, keep_alive: bool) -> None:
        """An answer built here: its status line and own headers, the server's, then the body."""
        # A browser reads no answer, a 429 or a 400 among them, without its CORS headers.
        own = [*self.server_state.default_headers, *self._cors]
        defaults = b"".join(name + b": " + value + b"\r\n" for name, value in own)
        closing = b"" if keep_alive else b"connection: close\r\n"
        self.transport.write(head + defaults + closing + b"\r\n" + body)
        if not keep_alive:
            self.transport.close()


def parse_error(exc: BaseException | None, fallback: str) -> ApiError:
    """The ApiError for a request the HTTP parser refused with `exc`."""
    if not isinstance(exc, httptools.HttpParserError):
        return ApiError(400, f"malformed HTTP request: {fallback}", MALFORMED)
    reason = str(exc) or fallback
    if "Content-Length overflow" in reason:
        return ApiError(
            413, "the declared Content-Length exceeds the request body limit (setting max_request_bytes)", TOO_LARGE
        )
    return ApiError(400, f"malformed HTTP request: {reason}", MALFORMED)


@functools.lru_cache(maxsize=64)
def _rendered(status: int, message: str, error_type: str, retry_after: int | None, path: str) -> tuple[bytes, bytes]:
    """The status line and own headers, and the body, of a refusal: the same bytes the ASGI gate
    sends (rendered by it once per distinct answer)."""
    response = ApiError(status, message, error_type, retry_after=retry_after).response_for(path)
    return _status_and_headers(response), response.body


def _status_and_headers(response: Response) -> bytes:
    head = [f"HTTP/1.1 {response.status_code} {HTTPStatus(response.status_code).phrase}\r\n".encode()]
    head += [name + b": " + value + b"\r\n" for name, value in response.raw_headers]
    return b"".join(head)


@functools.lru_cache(maxsize=8)
def _gate_of(app: ASGIApp) -> OverloadGate | None:
    """The overload gate under uvicorn's middlewares, if the app is served through one."""
    for _ in range(8):
        if isinstance(app, OverloadGate):
            return app
        app = getattr(app, "app", None)
    return None


def _path(url: bytes) -> str:
    """The path of the request line's target, as far as the parser read it."""
    return url.split(b"?", 1)[0].decode("latin-1")


def _unsent(transport: asyncio.Transport) -> int:
    """Bytes written to `transport` that its client has not yet acknowledged: those the transport
    holds and those in the socket's send queue (SIOCOUTQ), which shrinks as the client reads, while
    the transport's own buffer moves only when the kernel's has room for a third of its size."""
    size = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            size += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    return size


def _no_delay(transport: asyncio.Transport) -> None:
    """TCP_NODELAY on the connection. asyncio sets it only on sockets it knows for TCP, and neither
    listening socket here is one to it: a front end's comes from a descriptor (uvicorn's `fd`, read
    as AF_UNIX), the one-process serve's from windve/listeners.py (protocol 0). Without it an answer,
    written as its head and then its body (before one_write.py), waited for the client's delayed ACK of the head: ~40 ms
    on every request after the first on a kept-alive connection, which no server-side timer saw."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # not a TCP socket
            pass
