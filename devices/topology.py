"""CPU and NUMA topology read from sysfs, limited to the CPUs this process may run on.

Files read (all relative to the sysfs root, normally `/sys`):

- `devices/system/cpu/online`                                required
- `devices/system/cpu/cpuN/topology/thread_siblings_list`    SMT siblings of cpuN
- `devices/system/cpu/cpuN/topology/core_id`, `physical_package_id`   for the report
- `devices/system/node/online`                               online NUMA nodes
- `devices/system/node/nodeN/cpulist`                        required for each online node
- `devices/system/node/nodeN/distance`                       SLIT row, one entry per online node
- `devices/system/node/nodeN/meminfo`                        `MemTotal` (memory-only nodes)

A file that exists but cannot be parsed is always a DeviceError naming it. Documented
fallbacks for files that are absent:

- no `node/online` (kernel without NUMA): one node 0 holding every online CPU;
- no `nodeN/distance` or `nodeN/meminfo`: distances / memory unknown (reported empty);
- no `cpuN/topology` directory: cpuN is its own physical core, ids unknown.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

from devices.cpu_quota import cpu_quota
from devices.cpulist import format_cpulist, parse_cpulist
from devices.errors import DeviceError

ARM_ARCHITECTURES = ("aarch64", "arm64")


@dataclass(frozen=True)
class Cpu:
    """One online logical CPU."""

    id: int
    node: int
    siblings: tuple[int, ...]  # logical CPUs sharing its physical core (thread_siblings_list), itself included
    core_id: int | None = None
    package: int | None = None

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "node": self.node,
            "siblings": list(self.siblings),
            "core_id": self.core_id,
            "package": self.package,
        }


@dataclass(frozen=True)
class NumaNode:
    """One online NUMA node. A node without CPUs holds memory only (CXL, HBM, ...)."""

    id: int
    cpus: tuple[int, ...]  # online CPUs of the node
    usable: tuple[int, ...]  # those this process may run on
    memory_kb: int | None = None  # MemTotal; None when meminfo is absent
    distances: Mapping[int, int] = field(default_factory=dict)  # other node id -> SLIT distance

    @property
    def memory_only(self) -> bool:
        return not self.cpus

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "cpus": list(self.cpus),
            "usable": list(self.usable),
            "memory_only": self.memory_only,
            "memory_kb": self.memory_kb,
            "distances": {str(node): distance for node, distance in self.distances.items()},
        }


@dataclass(frozen=True)
class CpuTopology:
    """The machine's CPUs and NUMA nodes as this process sees them."""

    arch: str
    nodes: tuple[NumaNode, ...]
    cpus: Mapping[int, Cpu]  # every online CPU, allowed or not
    allowed: frozenset[int]  # the process's CPU affinity (may name CPUs that are not online)
    sysfs_root: str = "/sys"
    notes: tuple[str, ...] = ()

    @property
    def is_arm(self) -> bool:
        return self.arch.lower() in ARM_ARCHITECTURES or self.arch.lower().startswith("arm")

    @property
    def online(self) -> tuple[int, ...]:
        return tuple(sorted(self.cpus))

    @cached_property
    def usable(self) -> tuple[int, ...]:
        """Online CPUs the process may run on: the only ones a plan may use."""
        return tuple(cpu for cpu in self.online if cpu in self.allowed)

    @property
    def cpu_nodes(self) -> tuple[NumaNode, ...]:
        """Nodes with at least one usable CPU, in node-id order: the nodes instances can go to."""
        return tuple(node for node in self.nodes if node.usable)

    @property
    def packages(self) -> tuple[int, ...]:
        return tuple(sorted({cpu.package for cpu in self.cpus.values() if cpu.package is not None}))

    def node_of(self, cpu: int) -> int:
        return self.cpus[cpu].node

    def physical_cores(self, cpus: Iterable[int]) -> list[tuple[int, ...]]:
        """Group `cpus` by physical core (SMT siblings together), ordered by lowest CPU id.

        Only the given CPUs appear: a core whose sibling is absent from `cpus` (reserved,
        not allowed) yields a one-CPU group.
        """
        groups: dict[tuple[int, ...], list[int]] = {}
        for cpu in sorted(set(cpus)):
            groups.setdefault(self.cpus[cpu].siblings, []).append(cpu)
        return sorted((tuple(group) for group in groups.values()), key=lambda group: group[0])

    def cores_by_node(self, cpus: Iterable[int]) -> dict[int, tuple[int, ...]]:
        """Split a core list by NUMA node, keeping its order (one TP rank per node)."""
        split: dict[int, list[int]] = {}
        for cpu in cpus:
            split.setdefault(self.node_of(cpu), []).append(cpu)
        return {node: tuple(split[node]) for node in sorted(split)}

    def to_dict(self) -> dict:
        return {
            "arch": self.arch,
            "sysfs_root": self.sysfs_root,
            "online": list(self.online),
            "usable": list(self.usable),
            "physical_cores": len(self.physical_cores(self.usable)),
            "packages": list(self.packages),
            "nodes": [node.to_dict() for node in self.nodes],
            "notes": list(self.notes),
        }


def read_topology(
    sysfs_root: str | os.PathLike[str] = "/sys",
    allowed_cpus: Iterable[int] | Literal["all"] | None = None,
    arch: str | None = None,
) -> CpuTopology:
    """Read the topology under `sysfs_root`.

    `allowed_cpus` defaults to `os.sched_getaffinity(0)`, a container's CPU set (its CPU quota,
    a Kubernetes CPU limit, is noted where it is below that set: cpu_quota.py);
    "all" allows every online CPU of the tree (previewing another machine's tree).
    `arch` defaults to `platform.machine()` (tests pass e.g. "aarch64").
    Raises DeviceError naming the file when a file is malformed or a required one is missing,
    or when none of the allowed CPUs is online.
    """
    root = Path(sysfs_root)
    reader = _SysfsReader(root)
    notes: list[str] = []

    online = reader.cpulist("devices/system/cpu/online", required=True)
    if allowed_cpus == "all":
        allowed = frozenset(online)
    else:
        allowed = frozenset(os.sched_getaffinity(0) if allowed_cpus is None else allowed_cpus)
    node_cpus = _read_node_cpus(reader, online, notes)
    node_ids = sorted(node_cpus)
    cpu_node = _invert(node_cpus, reader)

    unplaced = online - set(cpu_node)
    if unplaced:
        notes.append(f"online CPUs {format_cpulist(unplaced)} belong to no NUMA node and are not used")
    cpus = {cpu: _read_cpu(reader, cpu, cpu_node[cpu], notes) for cpu in sorted(cpu_node)}

    usable = {cpu for cpu in cpus if cpu in allowed}
    if not usable:
        raise DeviceError(
            f"none of the allowed CPUs ({format_cpulist(allowed) or 'none'}) is online in "
            f"{reader.path('devices/system/cpu/online')} ({format_cpulist(online)})"
        )
    if allowed_cpus is None:  # this process's own CPUs: its cgroup's quota applies to them
        quota = cpu_quota(root / "fs/cgroup")
        if quota is not None and quota < len(usable):
            notes.append(
                f"this process may use {quota:g} CPUs' time (its cgroup's CPU quota, a container's CPU limit) "
                f"but {len(usable)} CPUs: threads planned over all of them are throttled. Give the pod integer "
                "CPUs with requests == limits where the kubelet runs the static CPU manager (exclusive cores), "
                "or plan within the quota (cpu_layout: explicit)"
            )

    nodes = tuple(
        NumaNode(
            id=node,
            cpus=tuple(sorted(node_cpus[node])),
            usable=tuple(sorted(node_cpus[node] & usable)),
            memory_kb=_read_memtotal(reader, node),
            distances=_read_distances(reader, node, node_ids),
        )
        for node in node_ids
    )
    return CpuTopology(
        arch=arch or platform.machine(),
        nodes=nodes,
        cpus=cpus,
        allowed=allowed,
        sysfs_root=str(root),
        notes=tuple(notes),
    )


class _SysfsReader:
    """Reads small sysfs files; every failure becomes a DeviceError that names the file."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, relative: str) -> Path:
        return self.root / relative

    def text(self, relative: str, *, required: bool = False) -> str | None:
        path = self.path(relative)
        try:
            return path.read_text()
        except FileNotFoundError:
            if required:
                raise DeviceError(
                    f"{path} is missing (is {self.root} a sysfs tree? set --sysfs-root / WINDVE_SYSFS_ROOT)"
                ) from None
            return None
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise DeviceError(f"cannot read {path}: {reason}") from None

    def cpulist(self, relative: str, *, required: bool = False) -> set[int] | None:
        text = self.text(relative, required=required)
        if text is None:
            return None
        try:
            return parse_cpulist(text)
        except ValueError as exc:
            raise DeviceError(f"{self.path(relative)} is malformed: {exc}") from None

    def integer(self, relative: str) -> int | None:
        text = self.text(relative)
        if text is None:
            return None
        try:
            return int(text.strip())
        except ValueError:
            raise DeviceError(
                f"{self.path(relative)} is malformed: expected an integer, got {text.strip()!r}"
            ) from None


def _read_node_cpus(reader: _SysfsReader, online: set[int], notes: list[str]) -> dict[int, set[int]]:
    nodes = reader.cpulist("devices/system/node/online")
    if nodes is None:
        notes.append(
            f"{reader.path('devices/system/node/online')} is missing (no NUMA): all online CPUs form node 0"
        )
        return {0: set(online)}
    if not nodes:
        raise DeviceError(f"{reader.path('devices/system/node/online')} is malformed: it lists no node")
    # The kernel lists only online CPUs here; intersecting keeps a stale tree consistent.
    return {node: reader.cpulist(f"devices/system/node/node{node}/cpulist", required=True) & online for node in nodes}


def _invert(node_cpus: dict[int, set[int]], reader: _SysfsReader) -> dict[int, int]:
    cpu_node: dict[int, int] = {}
    for node in sorted(node_cpus):
        for cpu in node_cpus[node]:
            if cpu in cpu_node:
                raise DeviceError(
                    f"{reader.path(f'devices/system/node/node{node}/cpulist')} is malformed: "
                    f"CPU {cpu} is also listed by node {cpu_node[cpu]}"
                )
            cpu_node[cpu] = node
    return cpu_node


def _read_cpu(reader: _SysfsReader, cpu: int, node: int, notes: list[str]) -> Cpu:
    base = f"devices/system/cpu/cpu{cpu}/topology"
    siblings = reader.cpulist(f"{base}/thread_siblings_list")
    if siblings is None:
        if not any(note.startswith("no SMT information") for note in notes):
            notes.append(f"no SMT information ({reader.path(base)}/thread_siblings_list missing): each CPU is one core")
        siblings = {cpu}
    elif cpu not in siblings:
        siblings = reader.path(base + "/thread_siblings_list")
        raise DeviceError(f"{siblings} is malformed: it does not list CPU {cpu} itself")
    return Cpu(
        id=cpu,
        node=node,
        siblings=tuple(sorted(siblings)),
        core_id=reader.integer(f"{base}/core_id"),
        package=reader.integer(f"{base}/physical_package_id"),
    )


_MEMTOTAL = re.compile(r"^Node\s+\d+\s+MemTotal:\s+(\d+)\s*kB", re.MULTILINE)


def _read_memtotal(reader: _SysfsReader, node: int) -> int | None:
    relative = f"devices/system/node/node{node}/meminfo"
    text = reader.text(relative)
    if text is None:
        return None
    match = _MEMTOTAL.search(text)
    if match is None:
        raise DeviceError(f"{reader.path(relative)} is malformed: no 'Node {node} MemTotal: <n> kB' line")
    return int(match.group(1))


def _read_distances(reader: _SysfsReader, node: int, node_ids: list[int]) -> dict[int, int]:
    relative = f"devices/system/node/node{node}/distance"
    text = reader.text(relative)
    if text is None:
        return {}
    fields = text.split()
    if len(fields) != len(node_ids) or not all(value.isdigit() for value in fields):
        raise DeviceError(
            f"{reader.path(relative)} is malformed: expected {len(node_ids)} integer distances "
            f"(one per online node {format_cpulist(node_ids)}), got {text.strip()!r}"
        )
    return dict(zip(node_ids, (int(value) for value in fields)))
