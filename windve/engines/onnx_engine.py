"""onnxruntime engine: export once, fuse for BERT, cache by model hash, pick the provider.

Export uses torch's TorchScript ("legacy") exporter with eager attention at opset 17:
that graph is what onnxruntime's BERT fusion recognises (the dynamo exporter's is not).
The graph ends at the encoder's last hidden state; pooling and the Dense layers run after it
in windve.engines.head, the same code as the other engines (and the cached export does not
depend on them).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from windve.model import ModelSpec

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

OPSET = 17
DEFAULT_CACHE = Path(os.path.expanduser("~/.cache/windve/onnx"))


class OnnxEngineError(RuntimeError):
    pass


def execution_providers(device: str, available: list[str]) -> list:
    """onnxruntime providers for a device string: cpu, cuda:N (CUDA), npu:N (CANN/Ascend)."""
    kind, _, index = device.partition(":")
    device_id = int(index or 0)
    wanted = {"cpu": None, "cuda": "CUDAExecutionProvider", "npu": "CANNExecutionProvider"}
    if kind not in wanted:
        raise OnnxEngineError(f"onnx engine: unknown device {device!r} (cpu, cuda:N or npu:N)")
    provider = wanted[kind]
    if provider is None:
        return ["CPUExecutionProvider"]
    if provider not in available:
        raise OnnxEngineError(
            f"onnx engine on {device} needs {provider}, but this onnxruntime build has only "
            f"{available}; pip install 'windve[onnx-gpu]' in place of windve[onnx] (CUDA), or Huawei's "
            "onnxruntime-cann (Ascend)"
        )
    return [(provider, {"device_id": device_id}), "CPUExecutionProvider"]


def cached_model_path(spec: ModelSpec, dtype: str, cache_dir: Path | None) -> Path:
    import onnxruntime

    folder = Path(cache_dir or DEFAULT_CACHE)
    # The configuration is in the graph too (the activation, the pooling): its hash is in the name.
    name = f"{spec.revision}-{spec.config_hash}-opset{OPSET}-ort{onnxruntime.__version__}-{dtype}-fused.onnx"
    return folder / name


def export_and_fuse(spec: ModelSpec, target: Path, dtype: str) -> Path:
    """Export the encoder with eager attention, fuse it for BERT, write `target` atomically."""
    import torch
    from onnxruntime.transformers import optimizer

    from windve.engines.torch_engine import load_encoder

    target.parent.mkdir(parents=True, exist_ok=True)
    raw = target.with_suffix(f".raw.{os.getpid()}.onnx")
    model = load_encoder(spec, "fp32", attn="eager")
    sample = torch.ones((2, 16), dtype=torch.int64)
    torch.onnx.export(
        _HiddenStates(model),
        (sample, sample),
        str(raw),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes={
            "input_ids": {0: "batch", 1: "sequence"},
            "attention_mask": {0: "batch", 1: "sequence"},
            "last_hidden_state": {0: "batch", 1: "sequence"},
        },
        opset_version=OPSET,
        dynamo=False,
        do_constant_folding=True,
    )
    config = model.config
    fused = optimizer.optimize_model(
        str(raw),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
        opt_level=0,  # graph fusion here; onnxruntime applies its own level-99 passes at load
    )
    if dtype == "fp16":
        fused.convert_float_to_float16(keep_io_types=True)
    partial = target.with_suffix(f".part.{os.getpid()}")
    fused.save_model_to_file(str(partial))
    os.replace(partial, target)
    raw.unlink(missing_ok=True)
    log.info("exported and fused %s to %s", spec.name, target)
    return target


class _HiddenStates:
    """Positional (ids, mask) -> last hidden state: the graph signature the engine feeds."""

    def __new__(cls, model: torch.nn.Module) -> torch.nn.Module:
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
                return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        return Wrapper().eval()


class OnnxEngine:
    def __init__(
        self,
        spec: ModelSpec,
        device: str = "cpu",
        dtype: str = "fp32",
        cache_dir: Path | None = None,
        threads: int | None = None,
    ) -> None:
        import onnxruntime as ort

        from windve.engines.head import SentenceHead

        if dtype == "bf16":
            raise OnnxEngineError("onnx engine supports fp32 and fp16, not bf16; use the torch engine")
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self.dim = spec.dim
        path = cached_model_path(spec, dtype, cache_dir)
        if not path.is_file():
            export_and_fuse(spec, path, dtype)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(path), options, providers=execution_providers(device, ort.get_available_providers())
        )
        self.model_file = path
        self._head = SentenceHead.from_spec(spec)

    def embed(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        (hidden,) = self._session.run(
            None, {"input_ids": input_ids, "attention_mask": attention_mask}
        )
        return self._head.apply_numpy(hidden, attention_mask)

    def stage(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return input_ids, attention_mask  # onnxruntime copies its inputs itself

    def run(self, staged: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return self.embed(*staged)
