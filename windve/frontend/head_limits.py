"""Bounds on a request's head (request line and headers): its size and the time it takes to arrive.

uvicorn's httptools protocol has neither. A header that never ended was read for as long as it
came (300 MiB took the process from 485 to 1,031 MiB, and /health from ~1 ms to a median of 90 ms
while it came in); a connection that sent part of a head, or nothing, stayed open for ever, each
holding a descriptor. As hyper (TEI's server) does, a head must arrive within HEAD_SECONDS of the
connection or of its request's first byte; past MAX_HEAD_BYTES it is refused with 431 (nginx's
default allows 32 KiB; uvicorn's h11 protocol 16 KiB).

A body, once its head is in, must keep coming: BODY_IDLE_SECONDS without a byte of it is a 408
(nginx's client_body_timeout, 60 s, times the gap between two reads too). A connection that sent
a head and part of its body had been kept, unanswered, for as long as it stayed open.

An answer, once written, must be taken: SEND_IDLE_SECONDS in which the client read nothing of
what waits for it closes the connection (nginx's send_timeout, 60 s, also between two writes).
A client that stopped reading held its answers in the front end's memory for as long as it kept
the connection (30 answers of 9.6 MB: +226 MB); uvicorn and hyper have no such bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

MAX_HEAD_BYTES = 64 * 1024
HEAD_SECONDS = 30.0
BODY_IDLE_SECONDS = 30.0
SEND_IDLE_SECONDS = 30.0


class _Timed:
    """A deadline on part of a request, which calls `on_timeout` when it passes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_timeout: Callable[[], None]) -> None:
        self._loop = loop
        self._on_timeout = on_timeout
        self._timer: asyncio.TimerHandle | None = None

    def done(self) -> None:
        """That part is complete, or the connection gone."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class HeadGuard(_Timed):
    """One connection's head in progress: counts its bytes and times it out (HEAD_SECONDS)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_timeout: Callable[[], None]) -> None:
        super().__init__(loop, on_timeout)
        self.received = 0  # bytes read since the head began
        self.heads = 0  # heads begun on this connection

    def begin(self) -> None:
        """A head is awaited (a new connection) or has begun (a request's first byte); an armed
        timer keeps its deadline."""
        if self._timer is None:
            self.received = 0
            self.heads += 1
            self._timer = self._loop.call_later(HEAD_SECONDS, self._fire)

    def read(self, size: int, heads_before: int) -> bool:
        """A read of `size` bytes is over; `heads_before`: `heads` before it was parsed. Whether the
        head on its way is now over the limit.

        Only a read that carried nothing but the same head counts: one in which a head began may
        also hold the requests before it (pipelined, with their bodies), so a head is counted from
        the read after its first, and may pass the limit by one read before it is refused. This
        cuts off a head that never ends; one that ends is counted exactly (http_protocol.py)."""
        if self._timer is None or self.heads != heads_before:
            return False
        self.received += size
        return self.received > MAX_HEAD_BYTES

    def _fire(self) -> None:
        self._timer = None
        self._on_timeout()


class BodyTimer(_Timed):
    """One connection's body in progress: `on_timeout` is called once BODY_IDLE_SECONDS pass
    without a byte of it. A timer is set only for a body still coming once a read is parsed (most
    arrive with their head), and moved on only when it fires, not at every read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_timeout: Callable[[], None]) -> None:
        super().__init__(loop, on_timeout)
        self._last = 0.0
        self.coming = False  # a head is in and its body is not complete

    def progress(self) -> None:
        """A body begins (its head is in) or some of it came."""
        self._last = self._loop.time()
        self.coming = True

    def done(self) -> None:
        self.coming = False
        super().done()

    def read_over(self) -> None:
        """A read is parsed: time the body it left unfinished."""
        if self.coming and self._timer is None:
            self._timer = self._loop.call_at(self._last + BODY_IDLE_SECONDS, self._check)

    def _check(self) -> None:
        self._timer = None
        deadline = self._last + BODY_IDLE_SECONDS
        if self._loop.time() < deadline:  # bytes came since the timer was set
            self._timer = self._loop.call_at(deadline, self._check)
        else:
            self._on_timeout()


class SendTimer(_Timed):
    """One connection's answers waiting to be taken by its client: `on_timeout` is called once
    SEND_IDLE_SECONDS pass in which what is unsent did not shrink. Armed only while writing is
    paused (the transport holds more than its high-water mark), so a client that reads costs a
    timer per pause, not per write."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_timeout: Callable[[], None], buffered: Callable[[], int]):
        super().__init__(loop, on_timeout)
        self._buffered = buffered  # bytes written and not yet taken by the client
        self._left = 0

    def paused(self) -> None:
        """Writing paused: the client has not taken enough of what was written."""
        if self._timer is None:
            self._left = self._buffered()
            self._timer = self._loop.call_later(SEND_IDLE_SECONDS, self._check)

    def _check(self) -> None:
        self._timer = None
        left = self._buffered()
        if left < self._left:  # the client read some: slow, not stalled
            self.paused()
        else:
            self._on_timeout()
