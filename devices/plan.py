"""The instance plan: which instances run on which device and cores, in which pool.

Pool rules (WindVE paper IV-C), applied to automatic and explicit plans alike:
- one device kind only (no accelerator, or no CPU core left for a CPU pool): one pool,
  heterogeneous forced off;
- both kinds, heterogeneous off: accelerator pool only;
- both kinds, heterogeneous on: both pools, accelerator first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from devices import explicit as explicit_plan
from devices import layout
from devices.errors import PlanError
from devices.hardware import Hardware
from devices.specs import ENGINE_CHOICES, InstanceSpec, Plan, PoolSpec

__all__ = ["InstanceSpec", "Plan", "PoolSpec", "make_plan"]

DEVICE_CHOICES = ("auto", "cpu", "cuda", "npu")
LAYOUT_CHOICES = ("per-node", "tp", "explicit")
ONNX_PROVIDER_FOR = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "npu": "CANNExecutionProvider"}
# pyproject's extras that bring each provider (the CANN build of onnxruntime is Huawei's, not on PyPI)
ONNX_EXTRA_FOR = {"cpu": "windve[onnx]", "cuda": "windve[onnx-gpu]"}


def make_plan(
    hardware: Hardware,
    *,
    device: str = "auto",
    heterogeneous: bool = True,
    cpu_layout: str = "per-node",
    reserved_cores: Sequence[int] | None = None,
    explicit: Sequence[Any] | None = None,
    engine: str = "torch",
) -> Plan:
    """Plan the instances for `hardware`; raise PlanError naming what cannot work.

    `device` picks the accelerator kind for automatic plans (auto = any detected, cpu = none).
    `reserved_cores` None applies the reservation rule (see devices.layout) to automatic plans, and
    reserves none for an explicit one; a list is used as is.
    An `explicit` list (settings `plan:`) replaces the automatic plan whatever `cpu_layout` says
    (an empty one is refused, not read as no plan); `cpu_layout="explicit"` without one is an error.
    """
    _check_choice("device", device, DEVICE_CHOICES)
    _check_choice("cpu_layout", cpu_layout, LAYOUT_CHOICES)
    _check_choice("engine", engine, ENGINE_CHOICES)
    topology = hardware.topology
    notes: list[str] = []

    if explicit is not None or cpu_layout == "explicit":
        if explicit is None:
            raise PlanError("cpu_layout=explicit needs a non-empty `plan:` list of instances in the config file")
        if not explicit:
            raise PlanError("the `plan:` list is empty: name at least one instance, or leave `plan:` out")
        if cpu_layout != "explicit":
            notes.append(f"the explicit `plan:` list replaces cpu_layout={cpu_layout}")
        reserved = layout.checked_cores(topology, reserved_cores or (), "reserved_cores")
        accelerator, cpu = explicit_plan.explicit_instances(hardware, explicit, reserved, engine)
        chosen_layout = "explicit"
    else:
        accelerators = layout.choose_accelerators(hardware, device)
        if reserved_cores is None:
            reserved, reason = layout.auto_reserved(
                topology, with_accelerator=bool(accelerators), cpu_pool=heterogeneous
            )
            notes.append(reason)
        else:
            reserved = layout.checked_cores(topology, reserved_cores, "reserved_cores")
        accelerator = layout.accelerator_instances(topology, accelerators, reserved, engine, notes)
        cpu = layout.cpu_instances(topology, reserved, cpu_layout, engine)
        chosen_layout = cpu_layout

    _check_onnx_providers(hardware, accelerator + cpu)
    pools, mixed = _decide_pools(accelerator, cpu, heterogeneous, notes)
    return Plan(pools, tuple(sorted(reserved)), mixed, tuple(notes), chosen_layout)


def _decide_pools(
    accelerator: list[InstanceSpec], cpu: list[InstanceSpec], heterogeneous: bool, notes: list[str]
) -> tuple[tuple[PoolSpec, ...], bool]:
    if accelerator and cpu:
        if heterogeneous:
            return (PoolSpec("accelerator", tuple(accelerator)), PoolSpec("cpu", tuple(cpu))), True
        notes.append("heterogeneous off: accelerator pool only, no CPU offload")
        return (PoolSpec("accelerator", tuple(accelerator)),), False
    if not accelerator and not cpu:
        raise PlanError(
            "no instance can be planned: no accelerator and no usable CPU core left after the reserved ones"
        )
    only = PoolSpec("accelerator", tuple(accelerator)) if accelerator else PoolSpec("cpu", tuple(cpu))
    if heterogeneous:
        notes.append(f"one device kind ({only.name} pool only): heterogeneous forced off")
    return (only,), False


def _check_onnx_providers(hardware: Hardware, instances: list[InstanceSpec]) -> None:
    for instance in instances:
        kind = instance.device.split(":")[0]
        provider = ONNX_PROVIDER_FOR.get(kind)
        if instance.engine == "onnx" and provider and provider not in hardware.onnx_providers:
            extra = ONNX_EXTRA_FOR.get(kind)
            install = f"; pip install '{extra}'" if extra else ""
            raise PlanError(
                f"instance {instance.name}: engine onnx on {instance.device} needs onnxruntime's {provider} "
                f"(available: {', '.join(hardware.onnx_providers) or 'none, onnxruntime is not installed'}){install}"
            )


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise PlanError(f"unknown {name} {value!r} (expected one of {', '.join(choices)})")
