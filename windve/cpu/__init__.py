"""The CPU inference core: pinned worker processes and NUMA-local tensor parallelism.

Imported lazily: workers import this package before they pin themselves, and numpy or
torch must not be loaded before that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from windve.cpu.instance import CpuWorkerInstance

__all__ = ["CpuWorkerInstance"]


def __getattr__(name: str):
    if name == "CpuWorkerInstance":
        from windve.cpu.instance import CpuWorkerInstance

        return CpuWorkerInstance
    raise AttributeError(f"module 'windve.cpu' has no attribute {name!r}")
