"""How soon a thread that waits for the interpreter lock gets it, in a serving process.

A thread that wants the lock gets it only once the holder has run for the switch interval
(5 ms by default) or blocks. The dispatcher's event loop holds it while it reads, admits and
answers; an engine instance's threads need it for a moment to hand a batch over and to take an
answer back, and each hand-off waited up to the interval. Measured on a real engine process with
the loop busy in steps of 3 ms (bench/handoff.py, bench/SERVED.md): the engine computed 72 % of
the time with the default interval, 95 % with 0.5 ms. Only waiting threads switch more often:
threads blocked in I/O, as these mostly are, cost nothing.
"""

from __future__ import annotations

import sys

HANDOFF_SWITCH_SECONDS = 0.0005


def shorten_thread_switches() -> None:
    """Call once in every process where an event loop and threads hand work to each other."""
    sys.setswitchinterval(HANDOFF_SWITCH_SECONDS)
