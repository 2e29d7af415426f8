"""Give the heap's freed memory back to the system now and then (glibc's malloc_trim).

A CPU engine runs batches of every shape (rows x tokens, each exact): glibc keeps what each one
freed in its heap, scattered between live blocks, and the process's memory grew by 0.5-0.9 MB per
new shape without end (MiniLM, fp32, one thread: 434 MB to 1,688 MB in 400 batches of random
shapes; with a trim after each, 528 MB). A trim costs milliseconds (median 3.8 ms, p99 16 ms
there), so it runs after a batch's answer is sent, at most once every TRIM_SECONDS.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

TRIM_SECONDS = 2.0


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS). The process's own
    symbols, as the front end finds prctl (frontend/process.py): find_library would run ldconfig."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


class HeapTrimmer:
    def __init__(
        self,
        trim: Callable[[int], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._trim = trim if trim is not None else _malloc_trim()
        self._clock = clock
        self._last = clock()

    def after_batch(self) -> None:
        """A batch was answered: trim if the last trim is TRIM_SECONDS old."""
        if self._trim is None:
            return
        now = self._clock()
        if now - self._last >= TRIM_SECONDS:
            self._trim(0)
            self._last = self._clock()
