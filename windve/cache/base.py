"""The one interface both cache backends offer, and the entry <-> bytes encoding they share.

An entry is a text's vector and its token count: a request whose texts are all cached is
answered without tokenizing them (tokenizing a 75-token text costs about a third of a front
end's CPU per request), and its usage still counts every token. Its bytes: the count as a
little-endian uint32, then the vector as little-endian float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

VECTOR_DTYPE = np.dtype("<f4")  # little-endian float32 whatever the host, so replicas can share values
_COUNT_BYTES = 4  # the token count in front of the vector


class CachedVector(NamedTuple):
    """A cache hit: the vector (read-only float32) and how many tokens its text had as embedded."""

    vector: np.ndarray
    tokens: int


class EmbeddingCache(Protocol):
    """Async get/put of embedding vectors by cache key. Never raises for a backend outage:
    a failed lookup reads as misses and a failed store is dropped."""

    async def get_many(self, keys: Sequence[bytes]) -> list[CachedVector | None]:
        """One entry per key, None for a miss."""
        ...

    async def put_many(self, keys: Sequence[bytes], vectors: np.ndarray, tokens: Sequence[int]) -> None:
        """Store row i of `vectors` (float32 [len(keys), dim]) and its text's token count tokens[i]
        under keys[i]."""
        ...

    def stats(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


def encode_entries(vectors: np.ndarray, tokens: Sequence[int]) -> list[bytes]:
    """The stored bytes of each row of `vectors` with its token count."""
    rows = np.ascontiguousarray(vectors, dtype=VECTOR_DTYPE)
    if rows.ndim != 2 or rows.shape[0] != len(tokens):
        raise ValueError(f"expected {len(tokens)} vectors as a 2-D array, got shape {rows.shape}")
    return [
        int(count).to_bytes(_COUNT_BYTES, "little") + row.tobytes() for count, row in zip(tokens, rows, strict=True)
    ]


def decode_entry(raw: bytes | None, dimension: int | None = None) -> CachedVector | None:
    """A zero-copy view of the stored vector, and its token count. A value of impossible length, or
    of a vector of another size than `dimension` (a shared Redis written to by hand), reads as a
    miss: as a hit it had made the request a 500."""
    if not raw or len(raw) <= _COUNT_BYTES or len(raw) % VECTOR_DTYPE.itemsize:
        return None
    if dimension is not None and len(raw) != _COUNT_BYTES + dimension * VECTOR_DTYPE.itemsize:
        return None
    vector = np.frombuffer(raw, dtype=VECTOR_DTYPE, offset=_COUNT_BYTES)
    return CachedVector(vector, int.from_bytes(raw[:_COUNT_BYTES], "little"))
