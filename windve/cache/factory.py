"""Pick the embedding cache from settings: none, in-process, or Redis with an in-process L1."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from windve.cache.base import EmbeddingCache
from windve.cache.local import LocalEmbeddingCache
from windve.cache.lru import LruTtlStore
from windve.cache.redis_backend import RedisEmbeddingCache
from windve.redis_client import CircuitBreaker, create_async_redis, describe_url

if TYPE_CHECKING:
    from windve.settings import Settings

# With Redis the shared store holds the bulk; each replica keeps only its hottest entries,
# which also answer while Redis is out.
MAX_L1_ENTRIES = 10_000


def create_cache(
    settings: Settings,
    *,
    l1_entries: int | None = None,
    breaker: CircuitBreaker | None = None,
    clock: Callable[[], float] = time.monotonic,
    dimension: int | None = None,
) -> EmbeddingCache | None:
    """None when cache_size is 0 (caching off). Builds no connection: Redis is reached on first use.
    `dimension`: the model's vector size; an entry of another size reads as a miss."""
    if settings.cache_size == 0:
        return None
    if not settings.redis_url:
        return LocalEmbeddingCache(LruTtlStore(settings.cache_size, settings.cache_ttl_seconds, clock), dimension)
    l1_size = min(settings.cache_size, MAX_L1_ENTRIES) if l1_entries is None else l1_entries
    return RedisEmbeddingCache(
        create_async_redis(settings.redis_url, settings.redis_timeout_seconds),
        ttl_seconds=settings.cache_ttl_seconds,
        timeout_seconds=settings.redis_timeout_seconds,
        breaker=breaker
        or CircuitBreaker(f"Redis embedding cache at {describe_url(settings.redis_url)}", clock=clock),
        l1=LruTtlStore(l1_size, settings.cache_ttl_seconds, clock) if l1_size else None,
        dimension=dimension,
    )
