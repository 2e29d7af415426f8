"""Explicit plans: the config file's `plan:` list, any instance on any device and core set.

Each entry (a mapping, or an object with these attributes such as settings.InstanceConfig):
`pool` (accelerator | cpu, required), `device` (cpu | cuda:N | npu:N, default cpu), `cores`
(CPU numbers; required for cpu devices, the feeding core otherwise), `tp` (default 1; for a cpu
device it must equal the NUMA nodes its cores span), `engine` (default: the engine setting),
`threads` (default: physical cores, or 1 for an accelerator), `name` (default `<pool>-<n>`, n counting
within the pool; unique).
A CPU engine in the accelerator pool is allowed: it is how a CPU-only machine runs two pools.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import Any

from devices.cpulist import format_cpulist
from devices.errors import PlanError
from devices.hardware import Hardware
from devices.layout import checked_cores, cpu_instance
from devices.specs import ENGINE_CHOICES, POOLS, InstanceSpec

FIELDS = ("name", "pool", "device", "cores", "tp", "engine", "threads")
_DEVICE = re.compile(r"(?P<kind>cuda|npu):(?P<index>\d+)")


def explicit_instances(
    hardware: Hardware, entries: Sequence[Any], reserved: Sequence[int], engine: str
) -> tuple[list[InstanceSpec], list[InstanceSpec]]:
    """Validate the entries and build (accelerator pool instances, cpu pool instances)."""
    by_pool: dict[str, list[InstanceSpec]] = {pool: [] for pool in POOLS}
    for position, item in enumerate(entries):
        entry = _fields(item, position)
        pool = entry.get("pool")
        if pool not in POOLS:
            raise PlanError(f"plan[{position}]: pool must be one of {', '.join(POOLS)}, got {pool!r}")
        name = str(entry.get("name") or f"{pool}-{len(by_pool[pool])}")
        by_pool[pool].append(_instance(hardware, entry, pool, name, f"plan[{position}] ({name})", reserved, engine))
    instances = by_pool["accelerator"] + by_pool["cpu"]
    _check_unique_names(instances)
    _check_no_overlap(instances)
    return by_pool["accelerator"], by_pool["cpu"]


def _instance(
    hardware: Hardware,
    entry: Mapping[str, Any],
    pool: str,
    name: str,
    label: str,
    reserved: Sequence[int],
    default_engine: str,
) -> InstanceSpec:
    topology = hardware.topology
    device = _device(hardware, entry.get("device") or "cpu", label)
    cores = checked_cores(topology, entry.get("cores") or (), label)
    tp = _positive(entry.get("tp", 1), "tp", label)
    threads = None if entry.get("threads") is None else _positive(entry["threads"], "threads", label)
    engine = entry.get("engine") or default_engine
    if engine not in ENGINE_CHOICES:
        raise PlanError(f"{label}: unknown engine {engine!r} (expected one of {', '.join(ENGINE_CHOICES)})")

    if device != "cpu":
        if tp != 1:
            raise PlanError(f"{label}: tp={tp} on {device}; tensor parallelism is for cpu instances only (use tp: 1)")
        nodes = tuple(sorted({topology.node_of(core) for core in cores}))
        return InstanceSpec(name, pool, device, cores, nodes, 1, engine, threads or 1)

    if not cores:
        raise PlanError(f"{label}: a cpu instance needs `cores` (CPU numbers to pin it to)")
    clash = sorted(set(cores) & set(reserved))
    if clash:
        raise PlanError(f"{label}: cores {format_cpulist(clash)} are reserved_cores for the service")
    instance = cpu_instance(topology, name, pool, cores, engine, threads)
    if tp != instance.tp:
        raise PlanError(
            f"{label}: tp={tp} but its cores {format_cpulist(cores)} span NUMA nodes "
            f"{format_cpulist(instance.numa_nodes)}: tp must be {instance.tp} (one rank per node)"
        )
    return instance


def _fields(item: Any, position: int) -> dict[str, Any]:
    if isinstance(item, Mapping):
        unknown = sorted(set(map(str, item)) - set(FIELDS))
        if unknown:
            raise PlanError(f"plan[{position}]: unknown keys {', '.join(unknown)} (allowed: {', '.join(FIELDS)})")
        return dict(item)
    if not hasattr(item, "pool"):
        raise PlanError(f"plan[{position}]: expected a mapping with a `pool` key, got {item!r}")
    return {field: getattr(item, field) for field in FIELDS if hasattr(item, field)}


def _device(hardware: Hardware, device: Any, label: str) -> str:
    text = str(device).strip().lower()
    if text == "cpu":
        return text
    match = _DEVICE.fullmatch(text)
    if match is None:
        hint = " (add an index, e.g. cuda:0)" if text in ("cuda", "npu") else ""
        raise PlanError(f"{label}: unknown device {device!r}; expected cpu, cuda:N or npu:N{hint}")
    present = [acc.device for acc in hardware.accelerators_of(match["kind"])]
    wanted = f"{match['kind']}:{int(match['index'])}"
    if wanted not in present:
        raise PlanError(f"{label}: device {wanted} does not exist (detected: {', '.join(present) or 'none'})")
    return wanted


def _positive(value: Any, what: str, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{label}: {what} must be a positive integer, got {value!r}")
    return value


def _check_unique_names(instances: Iterable[InstanceSpec]) -> None:
    seen: set[str] = set()
    for instance in instances:
        if instance.name in seen:
            raise PlanError(f"plan: two instances are named {instance.name!r}")
        seen.add(instance.name)


def _check_no_overlap(instances: Sequence[InstanceSpec]) -> None:
    for first, second in combinations(instances, 2):
        shared = set(first.cores) & set(second.cores)
        if shared:
            raise PlanError(f"plan: instances {first.name} and {second.name} share cores {format_cpulist(shared)}")
