"""How soon a thread that waits for the interpreter lock gets it, in a process that feeds an
accelerator's engine.

A thread that wants the lock gets it only once the holder has run for the switch interval
(5 ms by default) or blocks. The dispatcher's event loop holds it while it reads, admits and
answers; an engine instance's threads need it for a moment to hand a batch over and to take an
answer back, and each hand-off waited up to the interval. On an accelerator a batch takes a few
milliseconds, so the device idled for it. Measured on a real engine process with batches of
~3.5 ms and the loop busy in steps of 3 ms (bench/handoff.py, bench/SERVED.md): the engine
computed 71-74 % of the time with the default interval, 93-96 % with 0.5 ms.

CPU engines keep the default. Their batches take 50-120 ms, where a 5 ms hand-off is a few
percent, and on the 2-core default start (one process, the loop niced beside two engines) the
shorter interval served as many requests but with a longer tail: wrk's p99 was 4-22 % higher
at 64-192 clients in both of two alternating rounds (bench/SERVED.md).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

HANDOFF_SWITCH_SECONDS = 0.0005


def shorten_for_accelerators(devices: Iterable[str]) -> bool:
    """Shorten the switch interval when one of this process's engine instances runs on an
    accelerator (a device other than "cpu"); returns whether it did."""
    if all(device == "cpu" for device in devices):
        return False
    sys.setswitchinterval(HANDOFF_SWITCH_SECONDS)
    return True
