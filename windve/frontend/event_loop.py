"""The front end's event loop: asyncio's selector loop that notes when each request's bytes arrived.

A request's time to answer, which depth control fits and holds to the SLO, began when its bytes
were in the socket, not when the front end's callback got to them. In one loop step asyncio runs
the callbacks of every socket that epoll reported, one after another; under a storm of clients
that re-ask at once after each BUSY, a step reads thousands of requests, and the last of them
waited the whole step before its parse began (bench/SERVED.md: the service's own p99 read 0.3-0.7 s
under wrk's). Bytes that came during a step wait, too, for that step to end before the next
select reports them: with the service's p99 held at 0.9 s, its clients saw 5-12 % more
(bench/DEPTH_CONTROL.md, the hog runs).

So at each select, the loop peeks the kernel's arrival stamp (arrival_stamps.py) of every ready
connection the HTTP protocol registered (`watch_arrivals`), before any of them is read; the
protocol takes it (`arrival`) when the request's parse begins. A connection without a stamp (the
kernel had not begun stamping, or cannot) counts from the time its select returned, every ready
socket having been ready by then: a lower bound on the wait, never an overstatement.

The same peek reads the request line's first bytes: a connection whose next request is a health
probe goes first in the step, so that a probe waits for the step under way, not also for the sweep
of every other ready socket (bench/SERVED.md). The listening sockets come next: a new connection's
first request, in its socket by the time a long step ends, is read at its accept
(`_accept_connection`), and a Kubernetes probe comes on a new connection each time. Last in a sweep
of a thousand refusals and answers, it waited the whole sweep (on an H200 host at 10x the depth,
new-connection probes took up to 0.83 s where keep-alive ones took 0.54 s).

The loop also keeps the slow lane (slow_lane.py), where connections just answered BUSY wait to be
read again, so that a storm of refusals does not make every step a sweep over all of them.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import selectors
import socket
import struct
import time

from windve.frontend.arrival_stamps import peek_arrival, raw_socket
from windve.frontend.routes import HEALTH_PATHS
from windve.frontend.slow_lane import PER_STEP, SlowLane
from windve.heartbeat import LoopBeat

# Request lines of /health, whose answer the HTTP protocol makes at once (http_protocol.py).
PROBES = tuple(f"{method} {path}{end}".encode() for method in ("GET", "HEAD") for path in HEALTH_PATHS for end in " ?")
PROBE_PEEK = max(map(len, PROBES))
# accept() errors that a pause may cure, as asyncio's own accept has them.
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
ACCEPT_PAUSE = 1.0  # seconds, asyncio's
ACCEPT_WARNING_EVERY = 60.0  # seconds
# struct tcp_info (linux/tcp.h): eight one-byte fields, then u32 rto, ato, snd_mss, rcv_mss, unacked.
_TCP_LISTEN, _TCPI_UNACKED, _TCP_INFO_BYTES = 10, 24, 28

log = logging.getLogger(__name__)


class _StampingSelector(selectors.DefaultSelector):
    """The platform's selector (epoll on Linux), noting when each select returned and when the
    bytes waiting in each watched ready socket arrived, and handing the loop the connections whose
    next request is a health probe ahead of the other ready sockets."""

    def __init__(self) -> None:
        super().__init__()
        self.ready_at = 0.0
        self.watched: dict[int, socket.socket] = {}
        self.listening: set[int] = set()  # the front end's listening sockets' descriptors
        self.arrivals: dict[int, float] = {}  # this step's stamps, as time.perf_counter()

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(timeout)
        self.ready_at = now = time.perf_counter()
        arrivals, watched = self.arrivals, self.watched
        arrivals.clear()  # a stamp not taken in its step is of bytes read without a new request
        if not (watched or self.listening):
            return ready
        # asyncio runs the ready sockets' callbacks in this order, and under load a step is a sweep
        # of hundreds: a probe last in it waited the whole sweep. Health probes first, then the
        # accepts (whose first requests, probes among them, are read at the accept), then the rest.
        offset = time.time() - now
        probes, accepts, others = [], [], []
        for entry in ready:
            key, events = entry
            sock = watched.get(key.fd) if events & selectors.EVENT_READ else None
            if sock is not None and self.note_arrival(key.fd, sock, now, offset):
                probes.append(entry)
            elif key.fd in self.listening:
                accepts.append(entry)
            else:
                others.append(entry)
        return probes + accepts + others if probes or accepts else others

    def note_arrival(self, fd: int, sock: socket.socket, now: float, offset: float) -> bool:
        """Keep the kernel's stamp of the bytes waiting in `sock`, if any, for this step; whether
        they begin a health probe. `offset`: time.time() - time.perf_counter(), taken once per step."""
        head, stamp = peek_arrival(sock, PROBE_PEEK)
        if stamp is not None:
            self.arrivals[fd] = min(now, stamp - offset)
        return head.startswith(PROBES)


def _waiting_connections(sock: socket.socket) -> int | None:
    """Connections in the accept queue of listening TCP socket `sock` (Linux reports it as a
    listening socket's tcpi_unacked); None where it cannot be read."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
    except (OSError, AttributeError):  # not TCP (a Unix socket), or not Linux
        return None
    if len(info) < _TCP_INFO_BYTES or info[0] != _TCP_LISTEN:
        return None
    return struct.unpack_from("I", info, _TCPI_UNACKED)[0]


class FrontEndLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._stamps = _StampingSelector()
        super().__init__(self._stamps)
        self._accept_pauses = 0
        self._accept_warned_at = -math.inf
        # Connections answered BUSY wait here, unread, while the loop serves the others.
        self.slow_lane = SlowLane(self)
        # The front end's heartbeat (windve.heartbeat.LoopBeat), set by the app where the parent
        # watches it: reading a request is progress even in a step that lasts seconds.
        self.beat: LoopBeat | None = None

    def _accept_connection(self, protocol_factory, sock, sslcontext=None, server=None, backlog=100, *args):  # noqa: ANN001, ANN202 - asyncio's own signature
        """asyncio's accept (its listening socket's reader), making each plain connection's
        transport at once and starting it in this step. asyncio makes it in a task, a loop step
        later, and the transport schedules its start (connection_made, its reader) for the step
        after that; under load each step is a sweep of every ready socket, and a client on a new
        connection (a readiness probe is one, each time) waited a whole step more at each
        (bench/SERVED.md). TLS, or an asyncio without the methods this needs, goes asyncio's way."""
        if sslcontext is not None or not hasattr(self, "_make_socket_transport"):
            return super()._accept_connection(protocol_factory, sock, sslcontext, server, backlog, *args)
        # The connections waiting when the step began, not the backlog's 4,096: each accepted
        # request is read and may be answered here at once (a refusal); a client that opens a new
        # connection for each request was accepted again in the same callback, the step never ended,
        # and the admitted requests' answers waited with the engines idle (50 such clients: 48 200s
        # in 12 s, against 3,383 kept alive). What came meanwhile is accepted first in the next step.
        # Not a fixed number a step either: at 64, a burst of 1,530 clients' first requests waited
        # 24 long steps to be read, past the SLO.
        waiting = _waiting_connections(sock)
        for _ in range(PER_STEP if waiting is None else max(1, min(backlog, waiting))):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return None  # none waiting
            except OSError as error:
                if error.errno not in OUT_OF_RESOURCES:
                    raise  # the loop reports it
                self._pause_accepts(error, protocol_factory, sock, sslcontext, server, backlog, *args)
                return None
            conn.setblocking(False)
            if self.beat is not None:
                self.beat.progress()  # a burst of accepts is one long callback (windve.heartbeat)
            scheduled = len(self._ready)
            try:
                self._make_socket_transport(conn, protocol_factory(), extra={"peername": address}, server=server)
            except Exception as exc:  # noqa: BLE001 - one connection's failure must not stop the accepts
                conn.close()
                self.call_exception_handler({"message": "could not serve an accepted connection", "exception": exc})
            self._run_now(scheduled)
        return None

    def _pause_accepts(self, error: OSError, protocol_factory, sock, *args) -> None:  # noqa: ANN001 - asyncio's own
        """Out of descriptors (or memory): stop accepting for ACCEPT_PAUSE seconds, the waiting
        connections staying in the listen queue meanwhile, and say so at most once a minute.
        asyncio's own accept did not stop at the error: it reported it, traceback and all, and
        scheduled a resume, for each of the backlog's 4,096 tries in every step (a front end with 256
        descriptors and 400 clients wrote 71 MB of log in 8 s)."""
        self._remove_reader(sock.fileno())
        self.call_later(ACCEPT_PAUSE, self._start_serving, protocol_factory, sock, *args)
        self._accept_pauses += 1
        now = time.monotonic()
        if now - self._accept_warned_at >= ACCEPT_WARNING_EVERY:
            self._accept_warned_at = now
            import resource

            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            log.warning(
                "cannot accept connections (%s; this process may open %s files): paused %d time(s) for %g s "
                "since the last warning; raise the open-file limit (ulimit -n, LimitNOFILE) or add front ends",
                error.strerror, "unlimited" if limit == resource.RLIM_INFINITY else f"{limit:,}",
                self._accept_pauses, ACCEPT_PAUSE,
            )  # fmt: skip
            self._accept_pauses = 0

    def _run_now(self, scheduled: int) -> None:
        """Run, in order and now, the callbacks scheduled since the ready queue held `scheduled`: a new
        transport's connection_made and the registration of its reader, which would otherwise wait
        for the whole of this step's sweep. The HTTP protocol reads the first request there."""
        started = [self._ready.pop() for _ in range(len(self._ready) - scheduled)]
        for handle in reversed(started):
            if not handle.cancelled():
                handle._run()  # as the loop would: a callback's exception goes to the exception handler

    def _start_serving(self, protocol_factory, sock, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - asyncio's own signature
        """asyncio's start of a listening socket, noted so that each step runs its accepts early."""
        self._stamps.listening.add(sock.fileno())
        return super()._start_serving(protocol_factory, sock, *args, **kwargs)

    def _stop_serving(self, sock):  # noqa: ANN001, ANN202 - asyncio's own signature
        self._stamps.listening.discard(sock.fileno())
        return super()._stop_serving(sock)

    @property
    def ready_at(self) -> float:
        """time.perf_counter() when the current step's select returned."""
        return self._stamps.ready_at

    def watch_arrivals(self, transport: asyncio.BaseTransport) -> int | None:
        """Peek the arrival stamp of `transport`'s bytes at each select that finds them; the key
        for `arrival`, or None where its socket cannot be peeked."""
        sock = raw_socket(transport)
        if sock is None:
            return None
        fd = sock.fileno()
        self._stamps.watched[fd] = sock
        # A new connection's first request may be in its socket already, and read at once
        # (http_protocol.py): its stamp now, as a select's would be.
        now = time.perf_counter()
        self._stamps.note_arrival(fd, sock, now, time.time() - now)
        return fd

    def unwatch_arrivals(self, fd: int | None) -> None:
        """Before the connection's socket closes: its descriptor's number may be reused."""
        if fd is not None:
            self._stamps.watched.pop(fd, None)
            self._stamps.arrivals.pop(fd, None)

    def arrival(self, fd: int | None) -> float:
        """time.perf_counter() when the bytes this step read from `fd` arrived, taken once: the
        first request parsed from them began there, and any later one in the same bytes (HTTP
        pipelining) counts from the step's select. Without a stamp, from the step's select."""
        stamp = self._stamps.arrivals.pop(fd, None) if fd is not None else None
        return self._stamps.ready_at if stamp is None else stamp


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvicorn's loop factory for the front ends: `loop="windve.frontend.event_loop:new_event_loop"`."""
    return FrontEndLoop()
