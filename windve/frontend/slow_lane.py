"""The slow lane: a connection just answered BUSY is read again after the front end's other work.

Under a storm of clients that re-ask at once after each 429, every refused connection has its
next request waiting by the time the event loop polls again, and asyncio's loop reads every
ready socket in one step. A step became a sweep over thousands of refusals, and everything
else waited a whole sweep at each of its steps: an admitted request is read, started, sent to
an engine and answered over several steps, and /health, answered at read time, waited a sweep
too. The refusals also took as much CPU as the loop could get, from the engines on a small
machine. On 2 cores at 10x the depth: goodput 0.61-0.70 of the peak, the accepted p99 1.2-1.6 s
for a 1 s SLO (bench/SERVED.md).

So a connection answered BUSY stops being read (the transport's pause_reading: its next
request waits in its socket at no cost) and joins this FIFO. The lane lets parked connections
be read again at a pace set by the service's own answers: `per_answer` for each answer that was
not a refusal, `floor` a second whatever happens, at most `per_step` in one loop step. Refusals
then cost at most a few times what the answers cost, whatever the number of clients that
re-ask; connections that were not refused (clients being served, /health pollers, new
connections) are read at every step. A released connection whose client has gone, or has not
asked again, uses no release.

A parked client's request is answered as soon as it is read, BUSY if there is still no room: the
429 is never held back, but under a storm a client that re-asks at once waits about (parked
connections) / (per_answer x answers a second) for it to be read. One release per answer keeps the
refusals' CPU below the answers': where front ends set the rate (a GPU host), every refusal a
front end reads is CPU its admitted requests wait for. The kernel stamps when its
bytes arrived (SO_TIMESTAMPNS, read with MSG_PEEK at release), so its time to answer counts that
wait, and the gate refuses a request that waited longer than the SLO leaves beyond the pools'
live p99 (gate.py `lane_budget`).

A client that waits out the 429's Retry-After before it asks again is not kept waiting: a
connection parked for PATIENCE whose client has not asked again (or has only just) is read again
at once (http_protocol.py), at the cost of one peek. One that re-asked at once stays in the lane.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import Callable

from windve.frontend.arrival_stamps import peek_arrival, readable_socket

PER_STEP = 64  # connections released per loop step at most: the most refusals a step reads ahead of other work
# Connections released per answer the front end gives (not a refusal): refusals of clients that re-ask
# at once at most match the answers. At 4, on an H200 host at 10x the depth, they were 2.4 per 200 and
# took the front ends' CPU per 200 from ~1,050 us to ~1,450: 0.5-2.6 % of the 200s over the SLO, against
# 0.01 % at 1 (bench/SERVED.md, 2026-11-27, a fifth session).
PER_ANSWER = 1
FLOOR_PER_SECOND = 64  # released whatever the answers, so that no parked connection waits for ever
PATIENCE = 1.0  # seconds: the least Retry-After a 429 carries (http_protocol: a patient client's wake)
_TCP_CLOSE_WAIT = 8  # tcp_info's first byte, the connection's state (linux/tcp_states.h)


class SlowLane:
    """Parked connections, released oldest first: up to `per_answer` for each answer the front end
    gives, `floor` a second whatever it gives, at most `per_step` in one loop step."""

    def __init__(self, loop: asyncio.AbstractEventLoop, per_step: int = PER_STEP, per_answer: float = PER_ANSWER,
                 floor: float = FLOOR_PER_SECOND) -> None:
        self._loop = loop
        self._per_step = per_step
        self._per_answer = per_answer
        self._floor = floor
        self._parked: deque[Callable[[], bool]] = deque()
        self._credit = 0.0
        self._credited_at = loop.time()
        self._step: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, release: Callable[[], bool]) -> None:
        """Queue a paused connection. `release` resumes its reading and says whether a request was
        waiting to be read (a connection closed meanwhile, or whose client has not asked again,
        costs the loop nothing and uses no release)."""
        self._parked.append(release)
        self._schedule()

    def answered(self) -> None:
        """The front end gave an answer that was not a refusal: it earns releases."""
        self._credit = min(self._per_step, self._credit + self._per_answer)
        if self._parked:
            self._schedule()

    def _schedule(self) -> None:
        if self._step is None:
            self._step = self._loop.call_soon(self._release_some)

    def _release_some(self) -> None:
        self._step = None
        now = self._loop.time()
        self._credit = min(self._per_step, self._credit + (now - self._credited_at) * self._floor)
        self._credited_at = now
        while self._credit >= 1 and self._parked:
            if self._parked.popleft()():
                self._credit -= 1
        if not self._parked:
            return
        if self._credit >= 1:
            # Next step, after that step's reads: each step reads every other ready socket and at
            # most per_step of these.
            self._schedule()
        elif self._timer is None and self._floor > 0:
            self._timer = self._loop.call_later((1 - self._credit) / self._floor, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._schedule()


def peer_closed(transport: asyncio.BaseTransport) -> bool:
    """Whether the client has closed its side (TCP CLOSE_WAIT): a request still in the socket is
    read and answered, but nobody waits for it."""
    transport_socket = transport.get_extra_info("socket")
    try:
        info = transport_socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)
    except (AttributeError, OSError):
        return False
    return bool(info) and info[0] == _TCP_CLOSE_WAIT


def waiting_since(transport: asyncio.BaseTransport, floor: float) -> float | None:
    """time.perf_counter() when the bytes now waiting unread in the connection's socket arrived,
    as the kernel stamped them (None: nothing waits; now: no stamp). Peeked, so the bytes stay
    for the transport; never before `floor` (when the connection was parked: a client's re-ask
    came after its 429), never after now."""
    with readable_socket(transport) as sock:
        if sock is None:
            return None
        waiting, stamp = peek_arrival(sock)
    now = time.perf_counter()
    if not waiting:
        return None
    if stamp is None:  # counted from now, as a request read at once would be
        return now
    return min(now, max(floor, now - (time.time() - stamp)))
