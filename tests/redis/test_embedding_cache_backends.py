"""Both cache backends: keys, byte-identical round trips, LRU bound and TTL, stats and metrics."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import redis
from prometheus_client import REGISTRY

from tests.redis.redis_test_support import FakeClock, cache_settings, random_vectors
from windve.cache import (
    LocalEmbeddingCache,
    LruTtlStore,
    RedisEmbeddingCache,
    cache_key,
    cache_keys,
    create_cache,
)


def metric(name: str, backend: str) -> float:
    return REGISTRY.get_sample_value(name, {"backend": backend}) or 0.0


def test_key_depends_on_every_part_and_matches_the_batch_form() -> None:
    base = ("all-MiniLM-L6-v2", "abc123", True, True, "hello")
    variants = [
        ("other-model", "abc123", True, True, "hello"),
        ("all-MiniLM-L6-v2", "abc124", True, True, "hello"),
        ("all-MiniLM-L6-v2", "abc123", False, True, "hello"),
        ("all-MiniLM-L6-v2", "abc123", True, False, "hello"),
        ("all-MiniLM-L6-v2", "abc123", True, True, "hello "),
        # ':' inside a part must not let two (model, revision) pairs share a key
        ("all-MiniLM-L6-v2:abc123", "", True, True, "hello"),
    ]
    keys = {cache_key(*base)} | {cache_key(*variant) for variant in variants}
    assert len(keys) == 1 + len(variants)
    assert cache_key(*base) == cache_key(*base)
    texts = ["a", "b", "a", "é ☃"]
    assert cache_keys(*base[:4], texts) == [cache_key(*base[:4], text) for text in texts]


def test_lru_evicts_least_recently_used_past_capacity() -> None:
    store = LruTtlStore(capacity=3, ttl_seconds=60, clock=FakeClock())
    for key in (b"a", b"b", b"c"):
        store.put(key, key * 4)
    assert store.get(b"a") == b"aaaa"  # now b is the least recently used
    store.put(b"d", b"dddd")
    assert len(store) == 3
    assert store.get(b"b") is None
    assert [store.get(key) for key in (b"a", b"c", b"d")] == [b"aaaa", b"cccc", b"dddd"]


def test_lru_entries_expire_after_ttl() -> None:
    clock = FakeClock()
    store = LruTtlStore(capacity=10, ttl_seconds=30, clock=clock)
    store.put(b"old", b"1111")
    clock.advance(20)
    store.put(b"new", b"2222")
    clock.advance(10)  # old is exactly 30 s old: expired; new is 10 s old
    assert store.get(b"old") is None
    assert store.get(b"new") == b"2222"
    clock.advance(20)
    assert store.get(b"new") is None
    assert len(store) == 0


def test_cache_size_zero_turns_caching_off() -> None:
    assert create_cache(cache_settings(None, cache_size=0)) is None
    assert create_cache(cache_settings("redis://127.0.0.1:1/0", cache_size=0)) is None


def test_local_cache_round_trip_is_byte_identical_and_bounded() -> None:
    clock = FakeClock()
    cache = create_cache(cache_settings(None, cache_size=4, cache_ttl_seconds=100), clock=clock)
    assert isinstance(cache, LocalEmbeddingCache)
    keys = cache_keys("m", "r", True, True, [f"text {i}" for i in range(6)])
    vectors = random_vectors(6)
    hits_before = metric("windve_cache_hits_total", "local")
    misses_before = metric("windve_cache_misses_total", "local")

    async def scenario() -> None:
        assert await cache.get_many(keys) == [None] * 6
        await cache.put_many(keys, vectors, [1, 2, 3, 4, 5, 2**32 - 1])
        found = await cache.get_many(keys)
        # capacity 4: the two first stored were evicted
        assert found[:2] == [None, None]
        for row, entry in zip(vectors[2:], found[2:], strict=True):
            assert entry is not None and entry.vector.dtype == np.float32
            assert entry.vector.tobytes() == row.tobytes()
        assert [entry.tokens for entry in found[2:]] == [3, 4, 5, 2**32 - 1]
        clock.advance(100)
        assert await cache.get_many(keys[2:]) == [None] * 4

    asyncio.run(scenario())
    assert cache.stats()["hits"] == {"local": 4}
    assert cache.stats()["misses"] == {"local": 6 + 2 + 4}
    assert metric("windve_cache_hits_total", "local") - hits_before == 4
    assert metric("windve_cache_misses_total", "local") - misses_before == 12


def test_redis_round_trip_is_byte_identical_across_replicas(redis_server) -> None:
    keys = cache_keys("m", "r", False, True, [f"text {i}" for i in range(32)])
    vectors = random_vectors(32, seed=1)
    settings = cache_settings(redis_server.url, cache_ttl_seconds=600)
    hits_before = metric("windve_cache_hits_total", "redis")

    async def scenario() -> list:
        writer = create_cache(settings)
        assert isinstance(writer, RedisEmbeddingCache)
        assert await writer.get_many(keys) == [None] * 32
        await writer.put_many(keys, vectors, list(range(100, 132)))
        await writer.close()
        # another replica, without an L1, so every vector comes from Redis itself
        reader = create_cache(settings, l1_entries=0)
        found = await reader.get_many(keys)
        assert reader.stats()["hits"] == {"redis": 32}
        await reader.close()
        return found

    found = asyncio.run(scenario())
    for row, entry in zip(vectors, found, strict=True):
        assert entry is not None and entry.vector.shape == (384,) and entry.vector.dtype == np.float32
        assert entry.vector.tobytes() == row.tobytes()
    assert [entry.tokens for entry in found] == list(range(100, 132))
    assert metric("windve_cache_hits_total", "redis") - hits_before == 32

    client = redis.Redis.from_url(redis_server.url)
    # The value's bytes: the token count (uint32, little-endian), then the float32 vector.
    assert client.get(keys[0]) == (100).to_bytes(4, "little") + vectors[0].astype("<f4").tobytes()
    assert 0 < client.ttl(keys[0]) <= 600
    client.close()


def test_more_concurrent_requests_than_connections_wait_for_one(redis_server) -> None:
    """400 lookups at once, as 400 clients of one front end make them: redis-py's default pool
    raised at its 101st connection, which read as Redis down and switched the cache off while
    Redis idled. They now share a bounded pool and all hit."""
    from windve.redis_client import MAX_CONNECTIONS

    keys = cache_keys("m", "r", True, True, ["concurrent"])
    settings = cache_settings(redis_server.url, redis_timeout_seconds=5.0)  # a loaded machine

    async def scenario() -> list:
        cache = create_cache(settings, l1_entries=0)
        await cache.put_many(keys, random_vectors(1, seed=4), [9])
        found = await asyncio.gather(*(cache.get_many(keys) for _ in range(400)))
        stats = cache.stats()
        await cache.close()
        return found, stats

    client = redis.Redis.from_url(redis_server.url)
    connections_before = client.info("stats")["total_connections_received"]  # this client's included
    found, stats = asyncio.run(scenario())
    assert all(vectors[0] is not None for vectors in found)
    assert stats["redis_state"] == "closed" and not stats.get("errors")
    assert client.info("stats")["total_connections_received"] - connections_before <= MAX_CONNECTIONS
    client.close()


def test_redis_cache_answers_from_l1_and_mixes_hits_and_misses(redis_server) -> None:
    settings = cache_settings(redis_server.url)
    keys = cache_keys("m", "r", True, True, ["a", "b", "c", "d"])
    vectors = random_vectors(4, seed=2)

    async def scenario() -> None:
        cache = create_cache(settings, l1_entries=10)
        await cache.put_many(keys[:2], vectors[:2], [1, 2])
        # a second replica stores c; this one finds it in Redis, then keeps it in its L1
        other = create_cache(settings, l1_entries=0)
        await other.put_many(keys[2:3], vectors[2:3], [3])
        await other.close()
        found = await cache.get_many(keys)
        assert [entry is None for entry in found] == [False, False, False, True]
        assert found[2].vector.tobytes() == vectors[2].tobytes() and found[2].tokens == 3
        assert cache.stats()["hits"] == {"local": 2, "redis": 1}
        assert cache.stats()["misses"] == {"redis": 1}
        assert cache.stats()["local_entries"] == 3
        await cache.close()

    asyncio.run(scenario())


def test_put_rejects_vectors_that_do_not_match_the_keys() -> None:
    cache = create_cache(cache_settings(None))
    with pytest.raises(ValueError, match="expected 2 vectors"):
        asyncio.run(cache.put_many([b"a", b"b"], random_vectors(3), [1, 2]))
