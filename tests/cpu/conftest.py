"""Fixtures for the CPU core tests: MiniLM loaded once, one event loop for the session."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The test modules import cpu_helpers by name, whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def run_async():
    """Run a coroutine on one event loop shared by the session."""
    with asyncio.Runner() as runner:
        yield runner.run


@pytest.fixture(scope="session")
def minilm_spec():
    from windve.model import load_model_spec

    return load_model_spec()


@pytest.fixture(scope="session")
def minilm_engine(minilm_spec):
    """The unsharded in-process reference."""
    from windve.engines.torch_engine import TorchEngine

    return TorchEngine(minilm_spec, dtype="fp32")
