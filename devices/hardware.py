"""Everything the planner needs to know about the machine, in one value."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from devices.accelerators import Accelerator, detect_accelerators
from devices.topology import CpuTopology, read_topology


@dataclass(frozen=True)
class Hardware:
    """Detected accelerators, onnxruntime providers and CPU topology.

    Plan-logic tests build this directly (e.g. with a GPU in `accelerators`) from a fixture
    topology; at runtime only `detect_hardware` fills it.
    """

    topology: CpuTopology
    accelerators: tuple[Accelerator, ...] = ()
    onnx_providers: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def accelerators_of(self, kind: str) -> tuple[Accelerator, ...]:
        return tuple(acc for acc in self.accelerators if acc.kind == kind)

    def to_dict(self) -> dict:
        return {
            "accelerators": [acc.to_dict() for acc in self.accelerators],
            "onnx_providers": list(self.onnx_providers),
            "cpu": self.topology.to_dict(),
            "notes": list(self.notes),
        }


def detect_hardware(
    sysfs_root: str | os.PathLike[str] = "/sys",
    allowed_cpus: Iterable[int] | Literal["all"] | None = None,
    arch: str | None = None,
) -> Hardware:
    """Detect accelerators and the CPU topology under `sysfs_root`.

    `allowed_cpus`: the CPUs plans may use (default: this process's affinity; "all": every
    online CPU of the tree). `arch`: default `platform.machine()`.
    Raises DeviceError when the sysfs tree cannot be read.
    """
    topology = read_topology(sysfs_root, allowed_cpus=allowed_cpus, arch=arch)
    scan = detect_accelerators()
    return Hardware(
        topology=topology,
        accelerators=scan.accelerators,
        onnx_providers=scan.onnx_providers,
        notes=scan.notes,
    )
