"""The one interface both cache backends offer, and the vector <-> bytes encoding they share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

VECTOR_DTYPE = np.dtype("<f4")  # little-endian float32 whatever the host, so replicas can share values


class EmbeddingCache(Protocol):
    """Async get/put of embedding vectors by cache key. Never raises for a backend outage:
    a failed lookup reads as misses and a failed store is dropped."""

    async def get_many(self, keys: Sequence[bytes]) -> list[np.ndarray | None]:
        """One entry per key: a read-only float32 vector, or None for a miss."""
        ...

    async def put_many(self, keys: Sequence[bytes], vectors: np.ndarray) -> None:
        """Store row i of `vectors` (float32 [len(keys), dim]) under keys[i]."""
        ...

    def stats(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


def encode_vectors(vectors: np.ndarray, count: int) -> list[bytes]:
    rows = np.ascontiguousarray(vectors, dtype=VECTOR_DTYPE)
    if rows.ndim != 2 or rows.shape[0] != count:
        raise ValueError(f"expected {count} vectors as a 2-D array, got shape {rows.shape}")
    return [row.tobytes() for row in rows]


def decode_vector(raw: bytes | None) -> np.ndarray | None:
    """Zero-copy view of the stored bytes; a value of impossible length reads as a miss."""
    if not raw or len(raw) % VECTOR_DTYPE.itemsize:
        return None
    return np.frombuffer(raw, dtype=VECTOR_DTYPE)
