"""Sysfs trees in the real kernel's shapes, generated per test session.

Each machine is described by its NUMA nodes (node id -> cpulist, "" for a memory-only node),
the SLIT distance matrix, per-node memory, the SMT sibling offset (x86 numbers sibling
threads `c` and `c + offset`) and sockets. `write_sysfs` lays out the files the kernel
exposes under devices/system/{cpu,node}; the detector reads the same paths from /sys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devices import Accelerator, Hardware, read_topology
from devices.cpulist import format_cpulist, parse_cpulist


@dataclass(frozen=True)
class MachineShape:
    name: str
    arch: str
    nodes: dict[int, str]  # node id -> cpulist; "" = memory-only node
    distances: list[list[int]]  # SLIT rows in node-id order
    memory_kb: dict[int, int]
    node_package: dict[int, int]  # socket of each node with CPUs
    smt_offset: int | None = None  # sibling of CPU c is c + smt_offset (first threads below it)
    description: str = field(default="", compare=False)

    @property
    def cpus(self) -> set[int]:
        return set().union(*(parse_cpulist(text) for text in self.nodes.values()))

    def node_of(self, cpu: int) -> int:
        return next(node for node, text in self.nodes.items() if cpu in parse_cpulist(text))

    def siblings(self, cpu: int) -> set[int]:
        if self.smt_offset is None:
            return {cpu}
        first = cpu % self.smt_offset
        return {first, first + self.smt_offset}


VM2 = MachineShape(
    name="vm2",
    arch="x86_64",
    nodes={0: "0-1"},
    distances=[[10]],
    memory_kb={0: 5728468},
    node_package={0: 0},
    description="this 2-vCPU single-node VM",
)

KUNPENG920 = MachineShape(
    name="kunpeng920",
    arch="aarch64",
    nodes={0: "0-47", 1: "48-95", 2: "96-143", 3: "144-191"},
    # numactl -H of a 2-socket Kunpeng 920-4826: two dies per socket
    distances=[[10, 12, 20, 22], [12, 10, 22, 24], [20, 22, 10, 12], [22, 24, 12, 10]],
    memory_kb={0: 131_574_208, 1: 132_120_576, 2: 132_120_576, 3: 132_095_000},
    node_package={0: 0, 1: 0, 2: 1, 3: 1},
    description="4 NUMA nodes x 48 cores, no SMT, aarch64",
)

XEON2S = MachineShape(
    name="xeon2s",
    arch="x86_64",
    nodes={0: "0-11,24-35", 1: "12-23,36-47"},
    distances=[[10, 21], [21, 10]],
    memory_kb={0: 98_303_124, 1: 99_034_112},
    node_package={0: 0, 1: 1},
    smt_offset=24,
    description="2 sockets x 12 cores x SMT2, siblings c and c+24",
)

GAPPED = MachineShape(
    name="gapped",
    arch="x86_64",
    nodes={0: "0-15", 2: "16-31", 3: ""},
    # node 3 is CXL-attached memory: near node 0, far from node 2
    distances=[[10, 21, 14], [21, 10, 24], [14, 24, 10]],
    memory_kb={0: 65_536_000, 2: 65_536_000, 3: 268_435_456},
    node_package={0: 0, 2: 1},
    description="node ids 0, 2, 3 (1 offline); node 3 is memory-only",
)

SHAPES = {shape.name: shape for shape in (VM2, KUNPENG920, XEON2S, GAPPED)}


def write_sysfs(root: Path, shape: MachineShape) -> Path:
    """Write `shape` as a sysfs tree under `root`; return root (pass it as sysfs_root)."""
    node_dir = root / "devices/system/node"
    cpu_dir = root / "devices/system/cpu"
    node_ids = sorted(shape.nodes)
    cpus = sorted(shape.cpus)
    _write(node_dir / "online", format_cpulist(node_ids))
    _write(node_dir / "possible", f"0-{max(node_ids)}")
    _write(node_dir / "has_cpu", format_cpulist(n for n in node_ids if shape.nodes[n]))
    _write(node_dir / "has_memory", format_cpulist(node_ids))
    for row, node in enumerate(node_ids):
        _write(node_dir / f"node{node}/cpulist", shape.nodes[node])
        _write(node_dir / f"node{node}/distance", " ".join(str(d) for d in shape.distances[row]))
        _write(node_dir / f"node{node}/meminfo", _meminfo(node, shape.memory_kb[node]))
    for name in ("online", "possible", "present"):
        _write(cpu_dir / name, format_cpulist(cpus))
    core_ids = _core_ids(shape)
    for cpu in cpus:
        topology = cpu_dir / f"cpu{cpu}/topology"
        package = shape.node_package[shape.node_of(cpu)]
        package_cpus = [c for c in cpus if shape.node_package[shape.node_of(c)] == package]
        _write(topology / "thread_siblings_list", format_cpulist(shape.siblings(cpu)))
        _write(topology / "core_siblings_list", format_cpulist(package_cpus))
        _write(topology / "core_id", str(core_ids[cpu]))
        _write(topology / "physical_package_id", str(package))
        if cpu:  # the kernel offers no hotplug switch for the boot CPU
            _write(cpu_dir / f"cpu{cpu}/online", "1")
    return root


def _core_ids(shape: MachineShape) -> dict[int, int]:
    """core_id numbers cores within their package, siblings sharing one (as the kernel does)."""
    ids: dict[int, int] = {}
    next_id: dict[int, int] = {}
    for cpu in sorted(shape.cpus):
        first = min(shape.siblings(cpu))
        if first in ids:
            ids[cpu] = ids[first]
            continue
        package = shape.node_package[shape.node_of(cpu)]
        ids[cpu] = next_id.get(package, 0)
        next_id[package] = ids[cpu] + 1
    return ids


def _meminfo(node: int, total_kb: int) -> str:
    free = total_kb * 9 // 10
    lines = [("MemTotal", total_kb), ("MemFree", free), ("MemUsed", total_kb - free), ("SwapCached", 0), ("Active", 0)]
    return "".join(f"Node {node} {key + ':':<15} {value:>8} kB\n" for key, value in lines)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


@pytest.fixture(scope="session")
def sysfs_tree(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Shared read-only tree per machine name (built once per session)."""
    built: dict[str, Path] = {}

    def tree(name: str) -> Path:
        if name not in built:
            built[name] = write_sysfs(tmp_path_factory.mktemp(name), SHAPES[name])
        return built[name]

    return tree


@pytest.fixture
def fresh_tree(tmp_path: Path) -> Callable[[str], Path]:
    """A private tree per test, for tests that break or remove files."""

    def tree(name: str) -> Path:
        return write_sysfs(tmp_path / name, SHAPES[name])

    return tree


@pytest.fixture(scope="session")
def hardware_for(sysfs_tree: Callable[[str], Path]) -> Callable[..., Hardware]:
    """Hardware of a fixture machine; accelerators are whatever the test says the machine has."""

    def hardware(
        name: str,
        accelerators: tuple[Accelerator, ...] = (),
        allowed: str | None = None,
        providers: tuple[str, ...] = ("CPUExecutionProvider",),
    ) -> Hardware:
        topology = read_topology(
            sysfs_tree(name),
            allowed_cpus=parse_cpulist(allowed) if allowed is not None else "all",
            arch=SHAPES[name].arch,
        )
        return Hardware(topology=topology, accelerators=accelerators, onnx_providers=providers)

    return hardware
