"""Small shared pieces of the Redis tests (not a test module)."""

from __future__ import annotations

import numpy as np

from windve.settings import Settings


class FakeClock:
    """A monotonic clock the test moves by hand, so TTLs and cool-downs need no sleeping."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def cache_settings(redis_url: str | None, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "redis_url": redis_url,
        "cache_size": 1000,
        "cache_ttl_seconds": 3600,
        # generous: the machine is shared and loaded; outage tests bound calls by this
        "redis_timeout_seconds": 0.5,
    }
    return Settings(**{**values, **overrides})


def random_vectors(count: int, dim: int = 384, seed: int = 0) -> np.ndarray:
    """Every bit pattern is possible, NaN payloads and -0.0 included: a round trip must keep them all."""
    bits = np.random.default_rng(seed).integers(0, 2**32, size=(count, dim), dtype=np.uint32)
    return bits.view(np.float32)
