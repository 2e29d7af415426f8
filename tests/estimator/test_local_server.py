"""The server `windve calibrate` starts is the one it profiles, even where another takes its port."""

from __future__ import annotations

import asyncio
import sys
from urllib.parse import urlsplit

import httpx
import psutil

from estimator import local_server
from tests.estimator.conftest import SIM_SERVER
from tests.servers import free_port


def test_a_port_another_server_took_first_is_left_for_another(sim_server_factory, monkeypatch) -> None:
    """The free port is free a moment before the server binds it: one taken meanwhile by another
    server had been profiled as calibrate's own (its /health answered 200), silently."""
    other = sim_server_factory()
    taken = urlsplit(other.url).port
    ports = iter([taken, free_port()])
    monkeypatch.setattr(local_server, "free_port", lambda: next(ports))
    started: list[int] = []

    def command(port: int) -> list[str]:
        started.append(port)
        return [sys.executable, str(SIM_SERVER), "--port", str(port)]

    async def scenario() -> tuple[str, bool]:
        async with local_server.local_server(command, {}, start_timeout=60) as url:
            own = [child for child in psutil.Process().children() if child.pid != other.process.pid]
            assert httpx.get(url + "/health", timeout=5).status_code == 200
            return url, any(local_server._listens(child.pid, urlsplit(url).port) for child in own)

    url, served_by_own = asyncio.run(scenario())
    assert started[0] == taken and len(started) == 2
    assert urlsplit(url).port == started[1] != taken and served_by_own
    assert other.process.poll() is None  # the other server is not ours to stop
