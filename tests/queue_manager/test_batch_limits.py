"""Per-pool batch limits: the accelerator pool batches by a token budget, the CPU pool by its own."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import REGISTRY

from queue_manager.manager import QueueManager
from tests.queue_manager.doubles import InstantInstance


def test_each_pool_batches_within_its_own_limits():
    async def scenario():
        acc, cpu = InstantInstance("acc0"), InstantInstance("cpu0")
        qm = QueueManager(
            [("accelerator", 12, [acc]), ("cpu", 12, [cpu])],
            max_batch_size=3,  # the global limits: what a pool not named takes
            batch_limits={"accelerator": (8, 64)},
        )
        await qm.start()
        before = REGISTRY.get_sample_value("windve_batch_tokens_sum", {"pool": "accelerator"}) or 0.0
        # 12 eight-token queries fill the accelerator pool, 12 more the CPU pool, in one tick.
        await qm.submit([np.full(8, i + 1) for i in range(24)])
        # 8 x 8 tokens = 64: the token budget bounds the accelerator's batches; the CPU's take 3.
        assert acc.batches == [8, 4] and cpu.batches == [3, 3, 3, 3]
        after = REGISTRY.get_sample_value("windve_batch_tokens_sum", {"pool": "accelerator"})
        assert after - before == 12 * 8  # padded tokens per batch, summed
        pools = {pool["name"]: pool for pool in qm.snapshot()["pools"]}
        assert (pools["accelerator"]["max_batch_size"], pools["accelerator"]["max_batch_tokens"]) == (8, 64)
        assert (pools["cpu"]["max_batch_size"], pools["cpu"]["max_batch_tokens"]) == (3, 16384)
        await qm.close()

    asyncio.run(scenario())


def test_batch_limits_for_an_unknown_pool_are_an_error():
    with pytest.raises(ValueError, match="unknown pools"):
        QueueManager([("cpu", 4, [InstantInstance("cpu0")])], batch_limits={"gpu": (8, 64)})
