"""Redis killed, hung or restarted never fails or stalls a cache call; caching resumes afterwards."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from prometheus_client import REGISTRY

from tests.redis.redis_test_support import FakeClock, cache_settings, random_vectors
from windve.cache import cache_keys, create_cache
from windve.redis_client import CircuitBreaker

# "Does not hang", not a speed target: with a 0.5 s timeout a failing call gives up within
# ~1.5 s (connect + read deadline); a hang would be many seconds.
NO_HANG_SECONDS = 5.0
KEYS = cache_keys("m", "r", True, True, [f"text {i}" for i in range(8)])
VECTORS = random_vectors(8, seed=3)
TOKENS = list(range(10, 18))


async def timed(operation):
    started = time.monotonic()
    result = await operation
    return result, time.monotonic() - started


def redis_up() -> float | None:
    return REGISTRY.get_sample_value("windve_cache_redis_up", {"backend": "redis"})


def outage_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "windve.redis" and r.levelno == logging.WARNING]


def test_killed_redis_reads_as_misses_is_skipped_while_open_and_logged_once(redis_server, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="windve.redis")
    clock = FakeClock()
    breaker = CircuitBreaker("test cache", initial_cooldown=1.0, max_cooldown=4.0, clock=clock)
    cache = create_cache(cache_settings(redis_server.url), l1_entries=0, breaker=breaker)

    async def scenario() -> None:
        await cache.put_many(KEYS, VECTORS, TOKENS)
        assert all(vector is not None for vector in await cache.get_many(KEYS))
        redis_server.kill()

        found, seconds = await timed(cache.get_many(KEYS))
        assert found == [None] * 8 and seconds < NO_HANG_SECONDS
        assert cache.stats()["errors"] == {"redis": 1}
        assert breaker.state == "open" and redis_up() == 0  # /metrics tells an outage, not only the log

        # while open, calls skip Redis entirely: no new error, nothing stored, no exception
        _, seconds = await timed(cache.put_many(KEYS, VECTORS, TOKENS))
        assert seconds < NO_HANG_SECONDS
        assert await cache.get_many(KEYS) == [None] * 8
        assert cache.stats()["errors"] == {"redis": 1}

        # each cool-down lets one probe through; it fails again and the cool-down doubles
        for expected_errors, cooldown in ((2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0)):
            clock.advance(cooldown - 0.01)
            assert await cache.get_many(KEYS) == [None] * 8
            assert cache.stats()["errors"] == {"redis": expected_errors - 1}
            clock.advance(0.01)
            _, seconds = await timed(cache.get_many(KEYS))
            assert seconds < NO_HANG_SECONDS
            assert cache.stats()["errors"] == {"redis": expected_errors}

        assert len(outage_warnings(caplog)) == 1

        await asyncio.to_thread(redis_server.start)  # empty: no persistence
        clock.advance(4.0)
        await cache.put_many(KEYS, VECTORS, TOKENS)  # the probe succeeds and closes the breaker
        assert breaker.state == "closed" and redis_up() == 1
        found = await cache.get_many(KEYS)
        assert [entry.vector.tobytes() for entry in found] == [row.tobytes() for row in VECTORS]
        await cache.close()

    asyncio.run(scenario())
    assert len(outage_warnings(caplog)) == 1
    assert any("reachable again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_hung_redis_costs_one_timeout_then_is_skipped(redis_server) -> None:
    # The breaker runs on a fake clock: a stall of the (loaded) machine between two calls must
    # not count as a cool-down elapsing, or a probe would go to the hung Redis.
    clock = FakeClock()
    breaker = CircuitBreaker("test cache", initial_cooldown=0.2, max_cooldown=0.4, clock=clock)
    cache = create_cache(
        cache_settings(redis_server.url, redis_timeout_seconds=0.2), l1_entries=0, breaker=breaker
    )

    async def scenario() -> None:
        await cache.put_many(KEYS, VECTORS, TOKENS)  # warm connection
        redis_server.pause()  # SIGSTOP: the socket stays open, nothing answers
        try:
            found, seconds = await timed(cache.get_many(KEYS))
            assert found == [None] * 8 and seconds < NO_HANG_SECONDS
            assert cache.stats()["errors"] == {"redis": 1}
            assert breaker.state == "open"

            # breaker open: Redis is not even tried. A call to the hung Redis could only time
            # out, which would count a second error.
            found, seconds = await timed(cache.get_many(KEYS))
            assert found == [None] * 8 and seconds < NO_HANG_SECONDS
            await cache.put_many(KEYS, VECTORS, TOKENS)
            assert cache.stats()["errors"] == {"redis": 1}
            assert breaker.state == "open"

            # once the cool-down is over, one probe goes through, costs one more timeout and
            # reopens the breaker for the doubled cool-down
            clock.advance(0.2)
            found, seconds = await timed(cache.get_many(KEYS))
            assert found == [None] * 8 and seconds < NO_HANG_SECONDS
            assert cache.stats()["errors"] == {"redis": 2}
            assert breaker.state == "open"
            clock.advance(0.39)
            await cache.get_many(KEYS)
            assert cache.stats()["errors"] == {"redis": 2}
        finally:
            redis_server.resume()
        await wait_until_cached(cache, clock)
        await cache.close()

    asyncio.run(scenario())


async def wait_until_cached(cache, clock: FakeClock, deadline_seconds: float = 30.0) -> None:
    """Keep serving "requests" until one stores and reads back through Redis again; each round
    moves the breaker's fake clock past its longest cool-down, so every round may probe."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        clock.advance(cache.breaker.max_cooldown)
        await cache.put_many(KEYS, VECTORS, TOKENS)
        found = await cache.get_many(KEYS)
        if all(vector is not None for vector in found):
            return
        await asyncio.sleep(0.02)  # pacing of the polling loop; the condition above decides
    pytest.fail(f"caching did not resume within {deadline_seconds} s (stats: {cache.stats()})")


def test_kill_and_restart_under_concurrent_load_fails_no_call(redis_server, caplog) -> None:
    caplog.set_level(logging.INFO, logger="windve.redis")
    breaker = CircuitBreaker("test cache", initial_cooldown=0.1, max_cooldown=0.4)
    cache = create_cache(cache_settings(redis_server.url), l1_entries=0, breaker=breaker)
    calls = 0
    slowest = 0.0

    async def client(stop: asyncio.Event) -> None:
        nonlocal calls, slowest
        while not stop.is_set():
            _, get_seconds = await timed(cache.get_many(KEYS))
            _, put_seconds = await timed(cache.put_many(KEYS, VECTORS, TOKENS))
            calls += 1
            slowest = max(slowest, get_seconds, put_seconds)
            await asyncio.sleep(0)  # let the other clients and the killer run

    async def until(condition, what: str, deadline_seconds: float = 30.0) -> None:
        deadline = time.monotonic() + deadline_seconds
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        stop = asyncio.Event()
        clients = [asyncio.create_task(client(stop)) for _ in range(8)]
        await until(lambda: calls >= 40, "load before the kill")
        await asyncio.to_thread(redis_server.kill)
        errors_seen = lambda: cache.stats()["errors"].get("redis", 0) >= 1  # noqa: E731
        await until(errors_seen, "the outage to be noticed")
        served_during_outage = calls
        await until(lambda: calls >= served_during_outage + 40, "load during the outage")
        await asyncio.to_thread(redis_server.start)
        hits_before = cache.stats()["hits"].get("redis", 0)
        await until(lambda: cache.stats()["hits"].get("redis", 0) > hits_before + 40, "caching to resume")
        stop.set()
        await asyncio.gather(*clients)  # re-raises any exception a call let through
        await cache.close()

    asyncio.run(scenario())
    assert slowest < NO_HANG_SECONDS
    warnings = [r for r in caplog.records if r.name == "windve.redis" and r.levelno == logging.WARNING]
    assert len(warnings) == 1


def test_a_full_redis_refusing_stores_is_not_an_outage(redis_server, caplog) -> None:
    """Redis full under `noeviction` (its default) answers each SET with an OOM error. Each had
    opened the breaker and the next read closed it: two log lines a request, and reads skipped."""
    caplog.set_level(logging.INFO, logger="windve.redis")
    cache = create_cache(cache_settings(redis_server.url), l1_entries=0)
    import redis as redis_py

    admin = redis_py.Redis.from_url(redis_server.url)

    async def scenario() -> None:
        await cache.put_many(KEYS[:4], VECTORS[:4], TOKENS[:4])  # stored while there is room
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)  # full from now on: every write is refused
        for round_ in range(5):
            more = cache_keys("m", "r", True, True, [f"later {round_} {i}" for i in range(4)])
            await cache.put_many(more, VECTORS[4:], TOKENS[4:])
            assert cache.breaker.state == "closed"
            found = await cache.get_many(KEYS[:4])  # reads still go to Redis and hit
            assert all(vector is not None for vector in found)
        assert cache.stats()["errors"] == {"redis": 5}
        await cache.close()

    try:
        asyncio.run(scenario())
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
    records = [r for r in caplog.records if r.name == "windve.redis"]
    assert [r.levelno for r in records] == [logging.WARNING], [r.getMessage() for r in records]
    assert "refuses a command (OutOfMemoryError" in records[0].getMessage()
