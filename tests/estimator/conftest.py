"""Fixtures for the estimator tests: a real HTTP server in front of a simulated pool."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port

SIM_SERVER = Path(__file__).with_name("sim_server.py")


@dataclass
class SimServer:
    url: str
    process: subprocess.Popen


def _wait_healthy(server: SimServer, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"sim server exited with {server.process.returncode}")
        try:
            if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)  # polling a real condition, bounded by the deadline
    raise TimeoutError("sim server did not become healthy")


@pytest.fixture
def sim_server_factory() -> Iterator[Callable[..., SimServer]]:
    """Start `sim_server.py` processes with extra arguments; all are stopped afterwards."""
    started: list[SimServer] = []

    def start(*args: str) -> SimServer:
        port = free_port()
        process = subprocess.Popen([sys.executable, str(SIM_SERVER), "--port", str(port), *args])
        server = SimServer(f"http://127.0.0.1:{port}", process)
        started.append(server)
        _wait_healthy(server)
        return server

    yield start
    for server in started:
        server.process.terminate()
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
