"""The front end's event loop: asyncio's selector loop that notes when each step's sockets were ready.

A request's time to answer, which depth control fits and holds to the SLO, began when its bytes
were in the socket, not when the front end's callback got to them. In one loop step asyncio runs
the callbacks of every socket that epoll reported, one after another; under a storm of clients
that re-ask at once after each BUSY, a step reads thousands of requests, and the last of them
waited the whole step before its parse began (bench/SERVED.md: the service's own p99 read 0.3-0.7 s
under wrk's). Every socket reported by a select was ready when that select returned, so the
time the select returned is a lower bound on each request's arrival, never an overstatement:
`FrontEndLoop.ready_at`. What a request waited before that select (the rest of the step before)
stays unseen.

The loop also keeps the slow lane (slow_lane.py), where connections just answered BUSY wait to be
read again, so that a storm of refusals does not make every step a sweep over all of them.
"""

from __future__ import annotations

import asyncio
import selectors
import time

from windve.frontend.slow_lane import SlowLane


class _StampingSelector(selectors.DefaultSelector):
    """The platform's selector (epoll on Linux), noting when each select returned."""

    ready_at = 0.0

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(timeout)
        self.ready_at = time.perf_counter()
        return ready


class FrontEndLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._stamps = _StampingSelector()
        super().__init__(self._stamps)
        # Connections answered BUSY wait here, unread, while the loop serves the others.
        self.slow_lane = SlowLane(self)

    @property
    def ready_at(self) -> float:
        """time.perf_counter() when the current step's select returned."""
        return self._stamps.ready_at


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvicorn's loop factory for the front ends: `loop="windve.frontend.event_loop:new_event_loop"`."""
    return FrontEndLoop()
