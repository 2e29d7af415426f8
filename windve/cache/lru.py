"""A bounded, expiring, in-process map from cache key to vector bytes."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class LruTtlStore:
    """Least-recently-used eviction past `capacity` entries; entries older than `ttl_seconds`
    read as absent. Values are immutable bytes, so callers can never change a cached vector.
    Not thread-safe: used from one event loop."""

    def __init__(
        self, capacity: int, ttl_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if capacity < 1:
            raise ValueError(f"LRU capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._entries: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at, value = entry
        if self._clock() >= expires_at:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: bytes, value: bytes) -> None:
        self._entries[key] = (self._clock() + self.ttl_seconds, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
