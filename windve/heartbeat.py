"""A liveness beat from a child process to its parent, through a shared 8-byte stamp.

The child stamps CLOCK_MONOTONIC (the same clock in every process of the machine) into a memfd
the parent created and passed down; the parent reads the stamp whenever it likes. A SIGSTOPped,
deadlocked or swapped-out child stops stamping, which a pipe or a socket alone never tells: it
stays open and silent.

An engine process beats from a thread (`start_beating`): torch and onnxruntime release the GIL in
their kernels, so a long batch does not silence a healthy worker. A front end beats from its
event loop (`LoopBeat`): what it must show is that its loop turns, since a loop that stalls
holds every connection the kernel hashed to its listening socket.
"""

from __future__ import annotations

import asyncio
import logging
import math
import mmap
import os
import struct
import threading
import time

from windve.shared_record import SharedRecord, TornRead

_STAMP = struct.Struct("<d")
BEAT_SECONDS = 0.25
# A stamp later than this past the reader's clock is no stamp of this machine's workers.
FUTURE_SLACK = 1.0

log = logging.getLogger(__name__)


class HeartbeatBoard:
    """The parent's side: owns the memfd and reads the last stamp."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("windve-heartbeat", 0)  # no MFD_CLOEXEC flag: children inherit it
        os.ftruncate(self.fd, SharedRecord.size(_STAMP))
        self._map = mmap.mmap(self.fd, SharedRecord.size(_STAMP))
        self._record = SharedRecord(self._map, _STAMP)
        self.created = time.monotonic()
        self._warned = False  # about an impossible stamp: once per board
        self.reset()

    def reset(self) -> None:
        """Count from now: a freshly started worker has until the timeout to beat. Called while no
        worker beats on this board (a record has one writer at a time)."""
        self._record.write(time.monotonic())

    def age(self) -> float:
        """Seconds since the worker last beat; 0 for a stamp no worker of this board can have
        written (before the board existed, or in the future).

        Such a stamp was read once (0.0, 150 ms after a start, in a full test run on
        2026-11-25) and got a healthy instance killed: a read torn by a write, which the shared
        record now rules out (windve/shared_record.py). The check stays, logged with its raw values."""
        stamp, now = self.stamp(), time.monotonic()
        if self.created <= stamp <= now + FUTURE_SLACK:
            return now - stamp
        if not self._warned:
            log.warning("heartbeat board read an impossible stamp %.6f (board made %.6f, now %.6f); "
                        "not counted as silence", stamp, self.created, now)
            self._warned = True
        return 0.0

    def stamp(self) -> float:
        """The last beat's CLOCK_MONOTONIC time (the board's creation until the worker beats)."""
        try:
            return self._record.read()[0]
        except TornRead:  # the worker died in the middle of a beat: silent since the board was made
            return self.created

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)


def _child_side(fd: int) -> SharedRecord:
    """The board behind `fd`, an inherited memfd, mapped; the descriptor itself is closed."""
    board = SharedRecord(mmap.mmap(fd, SharedRecord.size(_STAMP)), _STAMP)
    os.close(fd)
    return board


def start_beating(fd: int, period: float = BEAT_SECONDS) -> threading.Thread:
    """The worker's side: a daemon thread that stamps the board every `period` seconds."""
    board = _child_side(fd)

    def beat() -> None:
        while True:
            board.write(time.monotonic())
            time.sleep(period)  # a beat's period, not a wait for a condition

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    return thread


class LoopBeat:
    """A front end's side: stamps the board from the running event loop, so that the stamp ages
    when the loop stops running its callbacks.

    A timer stamps every `period` seconds, and `progress()` (which the front end calls as it
    accepts and reads) stamps too once `period` has passed: a timer runs only between loop steps,
    and under a storm of new connections one accept callback took 0.3-0.7 s on two cores shared
    by four front ends (bench/SERVED.md). Such a loop is slow, not stalled. What no stamp can tell
    from a stall is a process the scheduler does not run: the parent's bound is set for that
    (settings `frontend_heartbeat_timeout_seconds`)."""

    def __init__(self, fd: int, period: float = BEAT_SECONDS) -> None:
        self._board = _child_side(fd)
        self._period = period
        self._last = -math.inf
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._tick()

    def progress(self) -> None:
        """The loop is running a callback: stamp, at most once a period."""
        now = time.monotonic()
        if now - self._last >= self._period:
            self._last = now
            self._board.write(now)

    def _tick(self) -> None:
        self.progress()
        self._timer = self._loop.call_later(self._period, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
