"""One real `windve serve` process on 127.0.0.1 for the load tests, started once per session.

The default plan (a CPU worker process), cache off so every request is inferred, and a CPU
queue depth of 2: two closed-loop users of one text each always fit, four users must meet
BUSY (429). One server serves both cases, as a model load takes many seconds on a shared
2-core machine.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import ServerProcess, start_server

QUEUE_DEPTH = 2
LOADTEST_SERVER_ARGS = ("--cache-size", "0", "--cpu-depth", str(QUEUE_DEPTH), "--depth-control", "static")


@pytest.fixture(scope="session")
def loadtest_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("loadtest-server"), *LOADTEST_SERVER_ARGS)
    yield server
    server.stop()
