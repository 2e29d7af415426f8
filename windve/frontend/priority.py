"""Front-end work yields the CPU to the engines when they share cores.

Under a storm of clients that re-ask at once, a front end answers BUSY as fast as the CPU
lets it; on cores it shares with engine processes that steals the engines' time and the
service's goodput falls with the load. A positive niceness gives the engines the CPU first:
refusals then come from the time the engines leave. Linux nices threads one by one, so in a
process that also feeds engines (one front end with the dispatcher inside) only the event
loop's thread, and the threads it starts, are niced; engine processes are started by other
threads and keep their priority.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

# The default where the front end carries the dispatcher (one process): refusals take the CPU the
# engines leave, and the admitted requests' work in this loop waits for it too.
SINGLE_PROCESS_NICE = 10


def loop_niceness(setting: int | None) -> int:
    """The niceness a front end's loop takes: `setting`, or where it is unset (one process; the
    supervisor resolves it for front ends of their own) SINGLE_PROCESS_NICE."""
    return SINGLE_PROCESS_NICE if setting is None else setting


def lower_this_thread(niceness: int) -> None:
    """Add `niceness` to the calling thread's nice value (Linux: per thread)."""
    if niceness <= 0:
        return
    try:
        current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), current + niceness)
    except (AttributeError, OSError) as error:  # not Linux, or not allowed: serve anyway
        log.warning("cannot lower the front end's CPU priority: %s", error)
