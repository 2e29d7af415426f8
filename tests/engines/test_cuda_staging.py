"""The accelerator engine's staging on CUDA and Ascend: pinned memory, a copy stream, from another
thread.

The device tests skip without the device (CI has none); run them on a GPU or NPU host. The CPU
half of stage/run is what every other engine test goes through (embed == run(stage)).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from windve.engines.torch_engine import TorchEngine, stream_module


def _npu_available() -> bool:
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        return False
    return torch.npu.is_available()


DEVICES = [
    pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")),
    pytest.param("npu:0", marks=pytest.mark.skipif(not _npu_available(), reason="needs an Ascend NPU and torch_npu")),
]


def test_accelerators_copy_on_their_own_streams_and_cpus_do_not():
    assert stream_module(torch.device("cuda:0")) is torch.cuda
    assert stream_module(torch.device("cpu")) is None


def _batch(rng: np.random.Generator, rows: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(1000, 20000, size=(rows, tokens))
    mask = np.ones_like(ids)
    for row in range(rows):
        cut = int(rng.integers(3, tokens + 1))
        ids[row, cut:], mask[row, cut:] = 0, 0
    return ids, mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("rows", "tokens"), [(1, 7), (5, 13), (37, 75), (218, 80)])
def test_a_batch_staged_in_another_thread_embeds_as_on_the_cpu(model_spec, device, rows, tokens):
    gpu, cpu = TorchEngine(model_spec, device, "fp32"), TorchEngine(model_spec, "cpu", "fp32")
    ids, mask = _batch(np.random.default_rng(rows), rows, tokens)
    staged = {}
    stager = threading.Thread(target=lambda: staged.setdefault("batch", gpu.stage(ids, mask)))
    stager.start()
    stager.join()
    got, want = gpu.run(staged["batch"]), cpu.embed(ids, mask)
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3
