"""Fixtures for the estimator tests: a real HTTP server in front of a simulated pool, and the
garbage collector kept out of the timings."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import free_port, wait_healthy

SIM_SERVER = Path(__file__).with_name("sim_server.py")


@pytest.fixture(autouse=True)
def collector_walks_only_this_test() -> Iterator[None]:
    """Freeze what earlier tests and fixtures left alive, for the length of each test.

    Some of these tests time real pools in this process. By then the suite's heap holds ~600k
    objects, and a full collection of it took 150-430 ms here: inside a timed level it reads as the
    pool's latency. Frozen, a collection walks only the test's own objects
    (none took over 5 ms inside a test's call in a probe of the real-calibration and algorithm
    tests). The thresholds come back too: `windve calibrate` run in-process sets them for serving
    (windve/gc_tuning.py).
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.fixture
def collector_when_measuring(monkeypatch) -> list[int]:
    """The young-generation threshold each time `windve calibrate` starts to measure a pool."""
    from windve.commands import calibrate

    seen: list[int] = []
    measure = calibrate.calibrate_pool

    async def recorded(*args, **kwargs):
        seen.append(gc.get_threshold()[0])
        return await measure(*args, **kwargs)

    monkeypatch.setattr(calibrate, "calibrate_pool", recorded)
    return seen


@dataclass
class SimServer:
    url: str
    process: subprocess.Popen


@pytest.fixture
def sim_server_factory() -> Iterator[Callable[..., SimServer]]:
    """Start `sim_server.py` processes with extra arguments; all are stopped afterwards."""
    started: list[SimServer] = []

    def start(*args: str) -> SimServer:
        port = free_port()
        process = subprocess.Popen([sys.executable, str(SIM_SERVER), "--port", str(port), *args])
        server = SimServer(f"http://127.0.0.1:{port}", process)
        started.append(server)
        wait_healthy(server, timeout=60.0)
        return server

    yield start
    for server in started:
        server.process.terminate()
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
