"""Garbage-collector settings for a serving process.

Every query allocates a few small objects; with CPython's default thresholds the young
generation is collected every ~700 allocations, and each collection also walks the
long-lived objects of the model and the web stack. Freezing what start-up created and
collecting the young generation less often removes those pauses from the request path.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def tune_gc_for_serving() -> None:
    """Call once start-up has loaded everything that lives as long as the process."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
