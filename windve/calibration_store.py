"""Calibrations shared through Redis: `windve calibrate` publishes, every `windve serve` watches.

A calibration is stored as JSON under `windve:calibration:{model_revision}:{hardware_fingerprint}`
(no TTL) and its key is announced on the channel `windve:calibration:updates`. Watchers take
the announcement as a hint and always re-read the key, and they also re-read it every
`poll_seconds`, so a missed message or a Redis restart still converges. "Newer" means a
larger `created` (epoch seconds or ISO 8601); the rest of the dict is opaque here.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import redis.asyncio
from redis.exceptions import WatchError

from windve.redis_client import REDIS_FAILURES, CircuitBreaker, create_async_redis, describe_url

log = logging.getLogger("windve.calibration_store")

KEY_PREFIX = "windve:calibration"
CHANNEL = "windve:calibration:updates"


class StaleCalibrationError(ValueError):
    """Redis already holds a newer calibration under the same key."""


def calibration_key(model_revision: str, hardware_fingerprint: str) -> str:
    return f"{KEY_PREFIX}:{model_revision}:{hardware_fingerprint}"


def key_of(calibration: dict[str, Any]) -> str:
    try:
        return calibration_key(calibration["model"]["revision"], calibration["hardware_fingerprint"])
    except (KeyError, TypeError):
        raise ValueError(
            "calibration needs model.revision and hardware_fingerprint to name its Redis key"
        ) from None


def created_of(calibration: dict[str, Any]) -> float:
    """`created` as epoch seconds; ISO 8601 without a zone is read as UTC."""
    created = calibration.get("created")
    if isinstance(created, (int, float)) and not isinstance(created, bool):
        return float(created)
    if isinstance(created, str):
        try:
            moment = datetime.fromisoformat(created)
        except ValueError:
            raise ValueError(f"calibration 'created' is not ISO 8601: {created!r}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    raise ValueError(f"calibration needs a 'created' time (epoch seconds or ISO 8601), got {created!r}")


async def publish(
    calibration: dict[str, Any],
    redis_url: str,
    *,
    key: str | None = None,
    force: bool = False,
    timeout_seconds: float = 5.0,
) -> str:
    """Store the calibration and announce it; returns the key.

    Refuses (StaleCalibrationError) to replace a calibration with a later `created` unless
    `force`, so a slow calibration job cannot undo a newer one. Raises redis errors: the
    caller (a CLI) should report them, unlike the serving path.
    """
    key = key or key_of(calibration)
    created = created_of(calibration)
    body = json.dumps(calibration)
    client = create_async_redis(redis_url, timeout_seconds)
    try:
        async with client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    stored = _parse(await pipe.get(key))
                    stored_created = _created_or_none(stored) if stored is not None else None
                    if not force and stored_created is not None and stored_created > created:
                        raise StaleCalibrationError(
                            f"{describe_url(redis_url)} already holds a newer calibration under {key} "
                            f"(created {stored['created']!r}, this one {calibration['created']!r}); "
                            "delete that key (redis-cli DEL) to replace it"
                        )
                    pipe.multi()
                    pipe.set(key, body)
                    pipe.publish(CHANNEL, key)
                    await pipe.execute()
                    return key
                except WatchError:
                    continue  # another publisher wrote the key between our read and write: re-decide
    finally:
        await client.aclose()


def publish_sync(
    calibration: dict[str, Any],
    redis_url: str,
    *,
    key: str | None = None,
    force: bool = False,
    timeout_seconds: float = 5.0,
) -> str:
    """publish() for callers without an event loop (the `windve calibrate` CLI)."""
    return asyncio.run(publish(calibration, redis_url, key=key, force=force, timeout_seconds=timeout_seconds))


def _parse(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _created_or_none(calibration: dict[str, Any]) -> float | None:
    try:
        return created_of(calibration)
    except ValueError:
        return None


OnUpdate = Callable[[dict[str, Any]], None | Awaitable[None]]


class CalibrationWatcher:
    """Keeps `windve serve` on the newest calibration stored under one key.

    start() reads the stored calibration once (a bounded attempt: Redis being down only logs)
    and calls on_update if it is newer than `current`; a background task then follows the
    channel, re-reads the key every `poll_seconds`, and reconnects after an outage with the
    breaker's backoff. on_update (sync or async) gets each newer calibration once, in order
    of discovery; an exception in it is logged and the watcher goes on.
    """

    def __init__(
        self,
        redis_url: str,
        key: str,
        on_update: OnUpdate,
        *,
        current: dict[str, Any] | None = None,
        poll_seconds: float = 30.0,
        timeout_seconds: float = 2.0,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.key = key
        self.on_update = on_update
        self.current = current
        self.poll_seconds = poll_seconds
        self.timeout_seconds = timeout_seconds
        self.breaker = breaker or CircuitBreaker(f"Redis calibration store at {describe_url(redis_url)}")
        self._client: redis.asyncio.Redis = create_async_redis(redis_url, timeout_seconds)
        self._current_created = _created_or_none(current) if current else None
        self._unreadable: bytes | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> dict[str, Any] | None:
        """The calibration in force after the first read (`current` if Redis had nothing newer)."""
        ticket = self.breaker.allow()
        if ticket is not None:
            try:
                await self.refresh()
            except REDIS_FAILURES as exc:
                self.breaker.failed(exc, ticket)
            else:
                self.breaker.succeeded(ticket)
        self._task = asyncio.create_task(self._follow(), name=f"calibration watcher {self.key}")
        return self.current

    async def stop(self) -> None:
        task, self._task = self._task, None
        while task is not None and not task.done():
            # On Python 3.11 redis-py's asyncio.wait_for around socket writes can swallow a
            # cancel that lands as the write completes (CPython gh-86296): cancel until it ends.
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)
        if task is not None and not task.cancelled() and task.exception() is not None:
            log.error("calibration watcher for %s had failed", self.key, exc_info=task.exception())
        await self._client.aclose()

    async def refresh(self) -> bool:
        """Read the key now; apply it if newer. True if on_update was called. Raises Redis errors."""
        async with asyncio.timeout(self.timeout_seconds * 2):  # connect + read, each under timeout_seconds
            raw = await self._client.get(self.key)
        calibration = _parse(raw)
        created = _created_or_none(calibration) if calibration is not None else None
        if raw is not None and created is None:
            if raw != self._unreadable:  # say it once per stored value, not once per poll
                log.warning(
                    "calibration under %s is not a JSON object with a 'created' time; ignored", self.key
                )
                self._unreadable = raw
            return False
        if created is None or (self._current_created is not None and created <= self._current_created):
            return False
        self.current, self._current_created = calibration, created
        try:
            result = self.on_update(calibration)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("applying the calibration from %s failed; keeping the watcher running", self.key)
        return True

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.breaker.seconds_until_retry())
            ticket = self.breaker.allow()
            if ticket is None:
                continue
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(CHANNEL)
                # Read after subscribing: whatever is published from now on reaches us.
                await self.refresh()
                self.breaker.succeeded(ticket)
                ticket = self.breaker.allow()  # the closed state's ticket, for a later failure
                await self._listen(pubsub)
            except Exception as exc:  # Redis errors, and anything unforeseen: never end the watcher
                self.breaker.failed(exc, ticket)
            finally:
                await _close_quietly(pubsub)

    async def _listen(self, pubsub: Any) -> None:
        """Re-read the key on each announcement of it, and at least every poll_seconds."""
        loop = asyncio.get_running_loop()
        next_poll = loop.time() + self.poll_seconds
        while True:
            message = await pubsub.get_message(
                ignore_subscribe_messages=True, timeout=max(0.0, next_poll - loop.time())
            )
            about_other_key = message is not None and message.get("data") != self.key.encode()
            if about_other_key and loop.time() < next_poll:
                continue
            await self.refresh()
            next_poll = loop.time() + self.poll_seconds


async def _close_quietly(pubsub: Any) -> None:
    with contextlib.suppress(*REDIS_FAILURES):  # the connection is already gone: nothing to release
        await pubsub.aclose()
