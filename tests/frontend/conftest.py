"""A second real server for the front-end tests: Matryoshka sizes declared, an API key set."""

from __future__ import annotations

import pytest

from tests.servers import ServerProcess, start_server

MATRYOSHKA_KEY = "client-test-key"
MATRYOSHKA_DIMS = (128, 256)
MATRYOSHKA_ORIGINS = ("https://app.example", "https://admin.example")


@pytest.fixture(scope="session")
def matryoshka_server(tmp_path_factory) -> ServerProcess:
    """all-MiniLM-L6-v2 with `dimensions` 128 and 256 allowed (as the environment spells a list),
    the API key set, browser calls from two origins only, and the cache off so every request is
    inferred."""
    env = {
        "WINDVE_MATRYOSHKA_DIMS": "[128,256]",
        "WINDVE_API_KEY": MATRYOSHKA_KEY,
        "WINDVE_CACHE_SIZE": "0",
        "WINDVE_CORS_ALLOW_ORIGINS": ",".join(MATRYOSHKA_ORIGINS),
        "WINDVE_CPU_DEPTH": "64",  # a set depth: no warm-up probe, which these tests do not need
    }
    server = start_server(tmp_path_factory.mktemp("matryoshka"), env=env)
    yield server
    server.stop()
