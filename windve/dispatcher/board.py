"""The dispatcher's state, published in a few shared bytes that every front end reads for free.

A front end consults it before any work: a full or draining service answers BUSY, and a
broken one 503, without a round trip to the dispatcher and without touching an engine.
/health reads it too, so it never waits behind embedding work. It is a hint, refreshed
every few milliseconds: admission itself is decided by the dispatcher, atomically.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from windve.shared_record import SharedRecord, TornRead

# ready, draining, health (0 none, 1 degraded, 2 ok, 3 no healthy instance), warming, free room,
# retry-after seconds, the pools' live p99 (seconds, NaN before any answer), stamp (monotonic
# seconds of the last refresh)
_LAYOUT = struct.Struct("<BBBBxxxxqddd")
REFRESH_SECONDS = 0.005
STALE_SECONDS = 2.0  # a board this old means the dispatcher is gone or stuck

STARTING, DEGRADED, OK, UNAVAILABLE = 0, 1, 2, 3


@dataclass(frozen=True)
class BoardState:
    ready: bool
    draining: bool
    health: int
    free_room: int
    retry_after: float
    age: float  # seconds since the dispatcher last refreshed the board
    # Ready but warming up: embeds are admitted (the warm-up probe's among them), /health says starting.
    warming: bool = False
    live_tail: float | None = None  # QueueManager.live_tail

    @property
    def alive(self) -> bool:
        return self.age < STALE_SECONDS


class StateBoard:
    """A file-backed shared mapping: the dispatcher writes, front ends read."""

    def __init__(self, path: Path, create: bool = False) -> None:
        self.path = Path(path)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(self.path, flags, 0o600)
        size = SharedRecord.size(_LAYOUT)
        try:
            if create:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._record = SharedRecord(self._map, _LAYOUT)  # whole records only: a torn one read as stale
        if create:
            self.write(ready=False, draining=False, health=STARTING, free_room=0, retry_after=1.0)

    def write(
        self,
        *,
        ready: bool,
        draining: bool,
        health: int,
        free_room: int,
        retry_after: float,
        warming: bool = False,
        live_tail: float | None = None,
    ) -> None:
        tail = math.nan if live_tail is None else live_tail
        self._record.write(ready, draining, health, warming, free_room, retry_after, tail, time.monotonic())

    def read(self) -> BoardState:
        try:
            ready, draining, health, warming, free_room, retry_after, tail, stamp = self._record.read()
        except TornRead:  # the dispatcher died in the middle of a write: it is gone
            return BoardState(False, False, UNAVAILABLE, 0, 1.0, math.inf)
        age = time.monotonic() - stamp
        live_tail = None if math.isnan(tail) else tail
        return BoardState(bool(ready), bool(draining), health, free_room, retry_after, age, bool(warming), live_tail)

    def close(self) -> None:
        self._map.close()
