"""The accelerator engine's staging on CUDA: pinned memory, a copy stream, from another thread.

Skipped without CUDA (CI has none); run it on a GPU host. The CPU half of stage/run is what
every other engine test goes through (embed == run(stage)).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from windve.engines.torch_engine import TorchEngine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _batch(rng: np.random.Generator, rows: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(1000, 20000, size=(rows, tokens))
    mask = np.ones_like(ids)
    for row in range(rows):
        cut = int(rng.integers(3, tokens + 1))
        ids[row, cut:], mask[row, cut:] = 0, 0
    return ids, mask


@pytest.mark.parametrize(("rows", "tokens"), [(1, 7), (5, 13), (37, 75), (218, 80)])
def test_a_batch_staged_in_another_thread_embeds_as_on_the_cpu(model_spec, rows, tokens):
    gpu, cpu = TorchEngine(model_spec, "cuda:0", "fp32"), TorchEngine(model_spec, "cpu", "fp32")
    ids, mask = _batch(np.random.default_rng(rows), rows, tokens)
    staged = {}
    stager = threading.Thread(target=lambda: staged.setdefault("batch", gpu.stage(ids, mask)))
    stager.start()
    stager.join()
    got, want = gpu.run(staged["batch"]), cpu.embed(ids, mask)
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3
