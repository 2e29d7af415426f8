"""Fixtures for the estimator tests: a real HTTP server in front of a simulated pool."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import free_port, wait_healthy

SIM_SERVER = Path(__file__).with_name("sim_server.py")


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
