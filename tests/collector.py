"""What the garbage collector would have to free: objects left in reference cycles."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cycles_left() -> Iterator[list[object]]:
    """Fills the yielded list, once the block ends, with what a collection then finds unreachable.

    Objects freed by reference counting never show; cycles made before the block are collected
    first. The list holds the objects until the test drops it.
    """
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # a collection keeps what it finds in gc.garbage instead of freeing it
    found: list[object] = []
    try:
        yield found
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
