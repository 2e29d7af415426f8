"""Embedding cache: text -> vector for one model revision and request flags.

No Redis URL: an in-process LRU with a TTL. With one: Redis shared by all replicas, behind a
small in-process L1, with a circuit breaker so an outage never fails or slows a request.
"""

from windve.cache.base import EmbeddingCache
from windve.cache.factory import create_cache
from windve.cache.keys import cache_key, cache_keys
from windve.cache.local import LocalEmbeddingCache
from windve.cache.lru import LruTtlStore
from windve.cache.redis_backend import RedisEmbeddingCache

__all__ = [
    "EmbeddingCache",
    "LocalEmbeddingCache",
    "LruTtlStore",
    "RedisEmbeddingCache",
    "cache_key",
    "cache_keys",
    "create_cache",
]
