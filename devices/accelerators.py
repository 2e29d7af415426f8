"""Accelerators the process can use: CUDA GPUs (torch), Ascend NPUs (torch_npu), onnxruntime providers.

A library that is missing, or a driver that fails to initialise, means "none found" plus a
note saying why; detection never raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

AcceleratorKind = Literal["cuda", "npu"]


@dataclass(frozen=True)
class Accelerator:
    """One accelerator device as torch names it (`cuda:0`, `npu:1`)."""

    kind: AcceleratorKind
    index: int
    name: str
    memory_bytes: int | None = None

    @property
    def device(self) -> str:
        return f"{self.kind}:{self.index}"

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "kind": self.kind,
            "index": self.index,
            "name": self.name,
            "memory_bytes": self.memory_bytes,
        }


@dataclass(frozen=True)
class AcceleratorScan:
    accelerators: tuple[Accelerator, ...]
    onnx_providers: tuple[str, ...]
    notes: tuple[str, ...]


def detect_accelerators() -> AcceleratorScan:
    notes: list[str] = []
    found = _cuda_devices(notes) + _npu_devices(notes)
    return AcceleratorScan(found, _onnx_providers(notes), tuple(notes))


def _cuda_devices(notes: list[str]) -> tuple[Accelerator, ...]:
    try:
        import torch
    except ImportError:
        notes.append("torch is not installed: no CUDA GPU can be used")
        return ()
    try:
        if not torch.cuda.is_available():
            return ()
        return tuple(
            _accelerator("cuda", index, torch.cuda.get_device_properties(index))
            for index in range(torch.cuda.device_count())
        )
    except Exception as exc:  # a broken driver must not stop a CPU-only start
        notes.append(f"CUDA is present but failed to initialise ({exc}): no GPU used")
        return ()


def _npu_devices(notes: list[str]) -> tuple[Accelerator, ...]:
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError:
        return ()  # the usual case off Ascend machines: not worth a note
    except Exception as exc:  # torch_npu raises more than ImportError when CANN is broken
        notes.append(f"torch_npu failed to import ({type(exc).__name__}: {exc}): no NPU used")
        return ()
    try:
        if not torch.npu.is_available():
            return ()
        return tuple(
            _accelerator("npu", index, torch.npu.get_device_properties(index))
            for index in range(torch.npu.device_count())
        )
    except Exception as exc:
        notes.append(f"Ascend NPU runtime failed to initialise ({exc}): no NPU used")
        return ()


def _accelerator(kind: AcceleratorKind, index: int, properties: Any) -> Accelerator:
    memory = getattr(properties, "total_memory", None)
    return Accelerator(kind, index, str(getattr(properties, "name", kind)), int(memory) if memory else None)


def _onnx_providers(notes: list[str]) -> tuple[str, ...]:
    try:
        import onnxruntime
    except ImportError:
        notes.append("onnxruntime is not installed: the onnx engine is unavailable")
        return ()
    try:
        return tuple(onnxruntime.get_available_providers())
    except Exception as exc:
        notes.append(f"onnxruntime failed to list its providers ({exc})")
        return ()
