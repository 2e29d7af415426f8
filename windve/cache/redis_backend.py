"""The shared embedding cache: Redis behind a small in-process L1, never on the failure path.

One round trip per call (MGET; pipelined SET ... EX). Redis down, slow or restarting costs at
most one short timeout per breaker cool-down: the circuit breaker skips Redis meanwhile, the
lookup reads as misses (the L1 still answers what it holds) and stores go to the L1 only.
Entry count is bounded by the Redis server's `maxmemory` + eviction policy, not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import redis.asyncio
from redis.exceptions import ResponseError

from windve.cache.base import CachedVector, decode_entry, encode_entries
from windve.cache.lru import LruTtlStore
from windve.cache.metrics import REDIS_UP, CacheCounters
from windve.redis_client import REDIS_FAILURES, CircuitBreaker, describe_error

T = TypeVar("T")
log = logging.getLogger("windve.redis")

# socket_timeout bounds each socket read; a cold connect takes a few reads (connect, handshake),
# so the whole call gets a little more before we give up on it.
DEADLINE_PER_TIMEOUT = 3
REFUSAL_LOG_SECONDS = 60.0  # one warning per this long while Redis answers commands with errors


class RedisEmbeddingCache:
    backend = "redis"

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        ttl_seconds: int,
        timeout_seconds: float,
        breaker: CircuitBreaker,
        l1: LruTtlStore | None = None,
        dimension: int | None = None,
    ) -> None:
        self.client = client
        self.dimension = dimension  # the vectors' size: an entry of another reads as a miss
        self.ttl_seconds = ttl_seconds
        self.deadline_seconds = timeout_seconds * DEADLINE_PER_TIMEOUT
        self.breaker = breaker
        self.l1 = l1
        self.counters = CacheCounters()
        self._refusal_logged_at = -REFUSAL_LOG_SECONDS
        self._up = REDIS_UP.labels(self.backend)
        self._up.set(1)  # until a call fails: not known to be down

    async def get_many(self, keys: Sequence[bytes]) -> list[CachedVector | None]:
        l1 = self.l1
        dimension = self.dimension
        found = [decode_entry(l1.get(key), dimension) for key in keys] if l1 is not None else [None] * len(keys)
        wanted = [index for index, entry in enumerate(found) if entry is None]
        self.counters.add("hits", "local", len(keys) - len(wanted))
        if not wanted:
            return found
        answers = await self._call(lambda: self.client.mget([keys[index] for index in wanted]))
        redis_hits = 0
        for index, value in zip(wanted, answers or [None] * len(wanted), strict=True):
            entry = decode_entry(value, dimension)
            if entry is not None:
                found[index] = entry
                redis_hits += 1
                if l1 is not None:
                    l1.put(keys[index], value)
        self.counters.add("hits", "redis", redis_hits)
        self.counters.add("misses", "redis", len(wanted) - redis_hits)
        return found

    async def put_many(self, keys: Sequence[bytes], vectors: np.ndarray, tokens: Sequence[int]) -> None:
        values = encode_entries(vectors, tokens)
        if self.l1 is not None:
            for key, value in zip(keys, values, strict=True):
                self.l1.put(key, value)
        if not keys:
            return

        async def store() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for key, value in zip(keys, values, strict=True):
                pipe.set(key, value, ex=self.ttl_seconds)
            return await pipe.execute()

        await self._call(store)

    async def _call(self, operation: Callable[[], Awaitable[T]]) -> T | None:
        """The operation's result, or None if the breaker is open or Redis failed (never raises for Redis)."""
        ticket = self.breaker.allow()
        if ticket is None:
            self._up.set(0)
            return None
        try:
            async with asyncio.timeout(self.deadline_seconds):
                result = await operation()
        except ResponseError as exc:
            # Redis answered, with an error: full under `noeviction` (OOM), an ACL that forbids the
            # command. Not an outage: the breaker had opened at each refused store and closed at
            # the next read, logging twice a second and skipping reads that would have hit.
            self.breaker.succeeded(ticket)
            self._up.set(1)
            self.counters.add("errors", "redis")
            self._refused(exc)
            return None
        except REDIS_FAILURES as exc:
            self.breaker.failed(exc, ticket)
            self._up.set(0)
            self.counters.add("errors", "redis")
            await self._drop_idle_connections()
            return None
        except BaseException:
            self.breaker.abandoned(ticket)
            raise
        self.breaker.succeeded(ticket)
        self._up.set(1)
        return result

    def _refused(self, exc: ResponseError) -> None:
        now = time.monotonic()
        if now - self._refusal_logged_at >= REFUSAL_LOG_SECONDS:
            self._refusal_logged_at = now
            log.warning(
                "the embedding cache's Redis refuses a command (%s); requests go on, uncached where it "
                "refuses (a full Redis needs maxmemory-policy volatile-lru or allkeys-lru)",
                describe_error(exc),
            )

    async def _drop_idle_connections(self) -> None:
        """Pooled sockets to a server that failed are likely dead too: reconnect instead of
        letting each of them fail one call after Redis is back."""
        with contextlib.suppress(*REDIS_FAILURES):
            await self.client.connection_pool.disconnect(inuse_connections=False)

    def stats(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            **self.counters.values,
            "local_entries": len(self.l1) if self.l1 is not None else 0,
            "local_capacity": self.l1.capacity if self.l1 is not None else 0,
            "redis_state": self.breaker.state,
        }

    async def close(self) -> None:
        await self.client.aclose()
