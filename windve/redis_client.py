"""Redis connections from a URL, and the circuit breaker that keeps an outage off the request path.

URLs follow redis-py (`redis.asyncio.from_url`): `redis://[[user]:password@]host[:port][/db]`,
`rediss://...` for TLS (query options such as `?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem`),
`unix:///path/redis.sock`. Options given in the URL's query string win over ours.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

log = logging.getLogger("windve.redis")

# What a broken, slow or restarted server raises: redis-py errors, socket errors, and the
# builtin TimeoutError of our own deadline (asyncio.timeout).
REDIS_FAILURES: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)


def connection_options(timeout_seconds: float) -> dict[str, Any]:
    """Short timeouts and no retries: a failed call must fail fast; the breaker decides when to retry."""
    return {
        "socket_timeout": timeout_seconds,
        "socket_connect_timeout": timeout_seconds,
        "retry": Retry(NoBackoff(), 0),
    }


# Connections a process opens at most; a call beyond them waits for one (up to the timeout). The
# pool redis-py builds by default raises at its 101st connection instead, which under 400
# concurrent requests read as Redis being down and switched the cache off while Redis idled.
MAX_CONNECTIONS = 64


def create_async_redis(url: str, timeout_seconds: float, **options: Any) -> redis.asyncio.Redis:
    """An asyncio client; connects lazily, so it can be built before the event loop runs."""
    pooled = {**connection_options(timeout_seconds), "max_connections": MAX_CONNECTIONS, "timeout": timeout_seconds}
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, **{**pooled, **options})
    return redis.asyncio.Redis.from_pool(pool)


def describe_url(url: str) -> str:
    """The URL without credentials, for logs and errors."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    try:
        port = parts.port or 6379
    except ValueError:  # a malformed port: redis-py will say so when connecting
        return f"{parts.scheme}://{host}"
    db = parts.path.lstrip("/") or "0"
    return f"{parts.scheme}://{host}:{port}/{db}"


# What Redis says to a client that sent no password, by protocol (redis-py speaks RESP3's HELLO).
NO_PASSWORD_SENT = ("HELLO must be called with the client already authenticated", "Authentication required", "NOAUTH")


def describe_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if any(said in str(exc) for said in NO_PASSWORD_SENT):
        # Redis's own words name a protocol step, not the missing password.
        text += " (this Redis requires a password, and the URL has none: redis://:PASSWORD@host:port/db)"
    return text


class CircuitBreaker:
    """Closed: calls go through. A failure opens it for a cool-down (doubling up to a cap);
    after the cool-down one caller probes (half-open): success closes it, failure reopens it.

    allow() hands out a ticket that the caller passes back with the outcome; an outcome whose
    ticket predates the last state change (a call that was in flight when Redis died or came
    back) is stale and changes nothing. So one outage logs one warning when it starts and
    one info line when it ends, never one per call. Single-threaded by design (one asyncio loop).
    """

    def __init__(
        self,
        what: str,
        *,
        initial_cooldown: float = 1.0,
        max_cooldown: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self.what = what
        self.initial_cooldown = initial_cooldown
        self.max_cooldown = max_cooldown
        self._clock = clock
        self._log = logger
        self._cooldown = initial_cooldown
        self._retry_at = 0.0
        self._outage_since: float | None = None
        self._probing = False
        self._generation = 0  # bumped when an outage starts or ends

    @property
    def state(self) -> str:
        if self._outage_since is None:
            return "closed"
        return "half-open" if self._probing or self._clock() >= self._retry_at else "open"

    def allow(self) -> int | None:
        """None: skip Redis now. Otherwise a ticket for succeeded/failed/abandoned."""
        if self._outage_since is None:
            return self._generation
        if self._probing or self._clock() < self._retry_at:
            return None
        self._probing = True
        return self._generation

    def seconds_until_retry(self) -> float:
        if self._outage_since is None:
            return 0.0
        return max(0.0, self._retry_at - self._clock())

    def succeeded(self, ticket: int) -> None:
        if ticket != self._generation or self._outage_since is None:
            return
        self._log.info(
            "%s reachable again after %.1f s; resumed", self.what, self._clock() - self._outage_since
        )
        self._outage_since = None
        self._probing = False
        self._cooldown = self.initial_cooldown
        self._generation += 1

    def failed(self, exc: BaseException, ticket: int) -> None:
        if ticket != self._generation:
            return
        now = self._clock()
        if self._outage_since is None:
            self._outage_since = now
            self._cooldown = self.initial_cooldown
            self._generation += 1
            self._log.warning(
                "%s unavailable (%s); going on without it, retrying every %.1f-%.1f s",
                self.what,
                describe_error(exc),
                self.initial_cooldown,
                self.max_cooldown,
            )
        else:
            self._log.debug("%s still unavailable (%s)", self.what, describe_error(exc))
            self._cooldown = min(self._cooldown * 2, self.max_cooldown)
        self._probing = False
        self._retry_at = now + self._cooldown

    def abandoned(self, ticket: int) -> None:
        """The call was cancelled before it could tell: let the next caller probe."""
        if ticket == self._generation:
            self._probing = False
