"""Pick and build an engine from plain setting values."""

from __future__ import annotations

from pathlib import Path

from windve.engines.base import Engine
from windve.model import ModelSpec


def cpu_supports_bf16() -> bool:
    """AVX512-BF16 or AMX (x86) / BF16 (ARM SVE) make bf16 matmuls faster than fp32."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return any(flag in flags for flag in ("avx512_bf16", "amx_bf16", " bf16"))


def resolve_dtype(dtype: str, device: str, engine: str = "torch") -> str:
    """`auto`: fp16 on accelerators, bf16 on CPUs with bf16 units for torch, else fp32 (the onnx
    engine has no bf16: `auto` with it had stopped the start on every CPU with bf16 units)."""
    if dtype != "auto":
        return dtype
    if device.startswith(("cuda", "npu")):
        return "fp16"
    return "bf16" if engine == "torch" and cpu_supports_bf16() else "fp32"


def create_engine(
    spec: ModelSpec, engine: str, device: str, dtype: str, cache_dir: Path | None = None, threads: int | None = None
) -> Engine:
    """`threads` sizes onnxruntime's own pool; torch's is process-wide (torch.set_num_threads)."""
    dtype = resolve_dtype(dtype, device, engine)
    if engine == "torch":
        from windve.engines.torch_engine import TorchEngine

        return TorchEngine(spec, device=device, dtype=dtype)
    if engine == "onnx":
        from windve.engines.onnx_engine import OnnxEngine

        return OnnxEngine(spec, device=device, dtype=dtype, cache_dir=cache_dir, threads=threads)
    raise ValueError(f"unknown engine {engine!r} (expected torch or onnx)")
