"""Shared fixtures: the real model (loaded once), and real `windve serve` processes on 127.0.0.1."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

from tests.servers import ServerProcess, start_server
from windve.model import ModelSpec, load_model_spec

try:  # the Redis fixture lives beside the Redis tests' helpers
    from tests.redis_server import redis_server  # noqa: F401
except ImportError:
    pass


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "alone" in item.keywords and os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("judged against the machine's speed: run it without -n (pytest -m alone), not beside other tests")


@pytest.fixture(scope="session")
def model_spec() -> ModelSpec:
    return load_model_spec()


@pytest.fixture(scope="session")
def reference_model(model_spec: ModelSpec):
    """sentence-transformers itself: what every engine must agree with."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_spec.path), device="cpu")


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> ServerProcess:
    """The service on its defaults (CPU, bundled model), cache off so every request is inferred."""
    proc = start_server(tmp_path_factory.mktemp("server"), "--cache-size", "0")
    yield proc
    proc.stop()
