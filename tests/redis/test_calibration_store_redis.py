"""A calibration published by one process reaches a running watcher in another, live and across outages."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys

import pytest
import redis

from windve.calibration_store import (
    CHANNEL,
    CalibrationWatcher,
    StaleCalibrationError,
    calibration_key,
    created_of,
    publish_sync,
)
from windve.redis_client import CircuitBreaker

DELIVERY_DEADLINE_SECONDS = 30.0  # generous: a subprocess start on a shared, loaded machine


def calibration(created: float | str, depth: int) -> dict:
    return {
        "model": {"name": "all-MiniLM-L6-v2", "revision": "rev1"},
        "hardware_fingerprint": "x86_64-2c-1n",
        "created": created,
        "pools": {"cpu": {"depth": {"1.0": depth}}},
    }


KEY = calibration_key("rev1", "x86_64-2c-1n")


def publish_from_another_process(value: dict, url: str) -> str:
    """What `windve calibrate --redis-url` does: a separate process calling publish_sync."""
    code = (
        "import json, sys\n"
        "from windve.calibration_store import publish_sync\n"
        "print(publish_sync(json.loads(sys.argv[1]), sys.argv[2]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(value), url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def fast_breaker() -> CircuitBreaker:
    return CircuitBreaker("test calibration store", initial_cooldown=0.05, max_cooldown=0.2)


async def next_update(updates: asyncio.Queue) -> dict:
    return await asyncio.wait_for(updates.get(), DELIVERY_DEADLINE_SECONDS)


def test_created_accepts_epoch_seconds_and_iso_8601() -> None:
    assert created_of({"created": 1700000000}) == 1700000000.0
    assert created_of({"created": "2023-11-14T22:13:20Z"}) == 1700000000.0
    assert created_of({"created": "2023-11-14T22:13:20"}) == 1700000000.0  # no zone: UTC
    with pytest.raises(ValueError, match="created"):
        created_of({"created": None})


def test_published_in_one_process_is_read_at_start_and_newer_ones_arrive_live(redis_server) -> None:
    first, second = calibration(1000.0, 8), calibration("1970-01-01T00:20:00+00:00", 12)  # 1200 s
    assert publish_from_another_process(first, redis_server.url) == KEY

    async def scenario() -> None:
        updates: asyncio.Queue = asyncio.Queue()
        # a poll period far beyond the test: the second one can only arrive through pub/sub
        watcher = CalibrationWatcher(redis_server.url, KEY, updates.put_nowait, poll_seconds=3600)
        assert await watcher.start() == first
        assert await next_update(updates) == first
        await asyncio.to_thread(publish_from_another_process, second, redis_server.url)
        assert await next_update(updates) == second
        assert watcher.current == second
        assert updates.empty()
        await watcher.stop()

    asyncio.run(scenario())


def test_an_older_calibration_does_not_replace_a_newer_one(redis_server) -> None:
    newer, older = calibration(2000.0, 16), calibration(1000.0, 8)
    publish_sync(newer, redis_server.url)
    with pytest.raises(StaleCalibrationError, match="newer calibration"):
        publish_sync(older, redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    assert json.loads(client.get(KEY)) == newer
    publish_sync(older, redis_server.url, force=True)
    assert json.loads(client.get(KEY)) == older
    client.close()


def test_watcher_ignores_what_is_not_newer_than_its_current_calibration(redis_server) -> None:
    publish_sync(calibration(1000.0, 8), redis_server.url)
    applied: list[dict] = []

    async def scenario() -> None:
        current = calibration(1500.0, 10)  # e.g. read from the local calibration file
        watcher = CalibrationWatcher(
            redis_server.url, KEY, applied.append, current=current, poll_seconds=3600
        )
        assert await watcher.start() == current
        # the same key announced with nothing newer stored, then an unrelated key: no update
        client = redis.asyncio.Redis.from_url(redis_server.url)
        await client.publish(CHANNEL, KEY)
        await client.publish(CHANNEL, "windve:calibration:other:key")
        await client.aclose()
        newest = calibration(1600.0, 11)
        await asyncio.to_thread(publish_sync, newest, redis_server.url)
        while not applied:  # bounded by the test timeout; nothing else will append
            await asyncio.sleep(0.01)
        assert applied == [newest]
        await watcher.stop()

    asyncio.run(asyncio.wait_for(scenario(), DELIVERY_DEADLINE_SECONDS))


def test_watcher_starts_while_redis_is_down_and_survives_a_restart(redis_server, caplog) -> None:
    caplog.set_level(logging.INFO, logger="windve.redis")
    redis_server.stop()

    async def scenario() -> None:
        updates: asyncio.Queue = asyncio.Queue()
        watcher = CalibrationWatcher(
            redis_server.url,
            KEY,
            updates.put_nowait,
            poll_seconds=3600,
            timeout_seconds=0.5,
            breaker=fast_breaker(),
        )
        assert await watcher.start() is None  # Redis down: serve starts anyway

        await asyncio.to_thread(redis_server.start)
        first = calibration(1000.0, 8)
        await asyncio.to_thread(publish_from_another_process, first, redis_server.url)
        assert await next_update(updates) == first

        # restart empties Redis (no persistence); the next calibration job publishes again
        await asyncio.to_thread(redis_server.kill)
        await asyncio.to_thread(redis_server.start)
        second = calibration(2000.0, 12)
        await asyncio.to_thread(publish_from_another_process, second, redis_server.url)
        assert await next_update(updates) == second
        await watcher.stop()

    asyncio.run(scenario())
    store_logs = [
        r for r in caplog.records if r.name == "windve.redis" and "calibration store" in r.getMessage()
    ]
    assert sum(r.levelno == logging.WARNING for r in store_logs) == 2  # once per outage
    assert any("reachable again" in r.getMessage() for r in store_logs)


def test_polling_finds_a_calibration_whose_announcement_was_missed(redis_server) -> None:
    async def scenario() -> None:
        updates: asyncio.Queue = asyncio.Queue()
        watcher = CalibrationWatcher(redis_server.url, KEY, updates.put_nowait, poll_seconds=0.2)
        assert await watcher.start() is None
        silent = calibration(3000.0, 20)
        client = redis.asyncio.Redis.from_url(redis_server.url)
        await client.set(KEY, json.dumps(silent))  # stored without a message on the channel
        await client.aclose()
        assert await next_update(updates) == silent
        await watcher.stop()

    asyncio.run(scenario())
