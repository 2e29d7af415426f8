"""The embedding cache without Redis: an in-process LRU with a TTL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from windve.cache.base import CachedVector, decode_entry, encode_entries
from windve.cache.lru import LruTtlStore
from windve.cache.metrics import CacheCounters


class LocalEmbeddingCache:
    backend = "local"

    def __init__(self, store: LruTtlStore, dimension: int | None = None) -> None:
        self.store = store
        self.dimension = dimension  # the vectors' size: an entry of another reads as a miss
        self.counters = CacheCounters()

    async def get_many(self, keys: Sequence[bytes]) -> list[CachedVector | None]:
        found = [decode_entry(self.store.get(key), self.dimension) for key in keys]
        misses = sum(entry is None for entry in found)
        self.counters.add("hits", "local", len(found) - misses)
        self.counters.add("misses", "local", misses)
        return found

    async def put_many(self, keys: Sequence[bytes], vectors: np.ndarray, tokens: Sequence[int]) -> None:
        for key, value in zip(keys, encode_entries(vectors, tokens), strict=True):
            self.store.put(key, value)

    def stats(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            **self.counters.values,
            "local_entries": len(self.store),
            "local_capacity": self.store.capacity,
        }

    async def close(self) -> None:
        self.store.clear()
