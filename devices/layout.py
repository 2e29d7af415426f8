"""Automatic plans: reserved service cores, accelerator instances, CPU instances.

Reserved service cores (HTTP, tokenization, accelerator feeding threads), lowest CPU ids first,
whole physical cores (SMT siblings together), counted among the usable CPUs only:
- with an accelerator in the plan and no CPU pool (heterogeneous off): every usable core, as
  nothing else would use them and the host path (HTTP, tokenizing) is what limits a GPU;
- with an accelerator and a CPU pool: the first NUMA node that has usable CPUs when there are
  several such nodes, else three quarters of the physical cores (at least one), so that CPU
  offload cannot starve the accelerator's host path. Measured on an H200 host (16 cores,
  bench/SERVED.md, 2026-11-27): a front-end process spends ~0.9-1.0 ms of CPU per 75-token
  request, so feeding a bge-large-shaped encoder at its ~7,500-8,000 queries/s takes eight
  cores, and a MiniLM-shaped one more than the host has; with half the cores reserved, six
  front ends served MiniLM at most 5,869 req/s against 12,629 for twelve, and a 10x storm left the
  accepted p99 at 1.7 s, while the eight cores of the CPU pool added 6-30 queries/s of
  bge-large;
- without one: 1/16 of the physical cores (at least one), and none below
  SMALL_MACHINE_CORES physical cores, where every reserved core would be a large share of
  the CPU pool and the service's few threads can share cores with the instances.

CPU instances get the remaining usable CPUs: one per NUMA node (`per-node`) or one TP instance
over all nodes that have free CPUs (`tp`, one rank per node). Their cores are listed highest
index first on ARM (the low cores take the OS and the service), lowest first elsewhere. With
SMT an instance is pinned to both siblings of each of its physical cores but runs one compute
thread per physical core: the siblings do not add matmul throughput, and leaving them in the
affinity mask lets the worker's own housekeeping run without displacing a compute thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from devices.accelerators import Accelerator
from devices.cpulist import format_cpulist
from devices.errors import PlanError
from devices.hardware import Hardware
from devices.specs import InstanceSpec
from devices.topology import CpuTopology

SMALL_MACHINE_CORES = 8  # fewer usable physical cores and no accelerator: reserve none
CPU_ONLY_SHARE = 16  # without an accelerator, reserve 1/16 of the physical cores
ACCELERATOR_SHARE = 0.75  # with one and a CPU pool on a single node, reserve three quarters
ACCELERATOR_NAMES = {"cuda": "CUDA GPU", "npu": "Ascend NPU"}


def choose_accelerators(hardware: Hardware, device: str) -> tuple[Accelerator, ...]:
    """The accelerators an automatic plan uses: all of one kind (CUDA before NPU on `auto`)."""
    if device == "cpu":
        return ()
    if device == "auto":
        return hardware.accelerators_of("cuda") or hardware.accelerators_of("npu")
    found = hardware.accelerators_of(device)
    if not found:
        why = "; ".join(hardware.notes)
        reason = f" ({why})" if why else ""
        raise PlanError(f"device={device} but no {ACCELERATOR_NAMES[device]} was detected{reason}")
    return found


def auto_reserved(
    topology: CpuTopology, *, with_accelerator: bool, cpu_pool: bool = True
) -> tuple[tuple[int, ...], str]:
    """The reservation rule: (reserved CPUs, a note saying which rule chose them).

    `cpu_pool`: whether the plan keeps a CPU pool beside the accelerators (heterogeneous on)."""
    cores = topology.physical_cores(topology.usable)
    if with_accelerator and not cpu_pool:
        take, rule = len(cores), "every core: accelerator present, no CPU pool"
    elif with_accelerator:
        nodes = topology.cpu_nodes
        if len(nodes) > 1:
            first = nodes[0]
            return first.usable, (
                f"reserved NUMA node {first.id} (CPUs {format_cpulist(first.usable)}) for the service and "
                f"accelerator feeding ({len(nodes)} nodes, accelerator present)"
            )
        take = max(1, int(len(cores) * ACCELERATOR_SHARE))
        rule = "three quarters of the physical cores, accelerator present"
    elif len(cores) < SMALL_MACHINE_CORES:
        return (), f"no reserved cores: {len(cores)} physical cores (< {SMALL_MACHINE_CORES}) and no accelerator"
    else:
        take, rule = max(1, len(cores) // CPU_ONLY_SHARE), "1/16 of the physical cores, no accelerator"
    reserved = tuple(cpu for core in cores[:take] for cpu in core)
    return reserved, f"reserved CPUs {format_cpulist(reserved)} for the service ({rule})"


def checked_cores(topology: CpuTopology, cores: Iterable[object], what: str) -> tuple[int, ...]:
    """Validate a user-given core list: integers, online, allowed. Keeps order, drops repeats."""
    cores = list(cores)
    try:
        given = tuple(dict.fromkeys(_as_core(core) for core in cores))
    except (TypeError, ValueError):
        raise PlanError(f"{what}: cores must be CPU numbers, got {list(cores)!r}") from None
    missing = [core for core in given if core not in topology.cpus]
    if missing:
        raise PlanError(
            f"{what}: cores {format_cpulist(missing)} do not exist (online CPUs: {format_cpulist(topology.online)})"
        )
    disallowed = [core for core in given if core not in topology.allowed]
    if disallowed:
        raise PlanError(
            f"{what}: cores {format_cpulist(disallowed)} are not allowed for this process "
            f"(allowed CPUs: {format_cpulist(topology.usable)})"
        )
    return given


def _as_core(core: object) -> int:
    if isinstance(core, bool) or not isinstance(core, (int, str)):
        raise TypeError(core)
    value = int(core)
    if value < 0:
        raise ValueError(core)
    return value


def accelerator_instances(
    topology: CpuTopology,
    accelerators: Sequence[Accelerator],
    reserved: Sequence[int],
    engine: str,
    notes: list[str],
) -> list[InstanceSpec]:
    """One instance per accelerator, its feeding thread pinned to one reserved core."""
    # Highest reserved cores first: the lowest take interrupts and the HTTP/tokenizer threads.
    feeding = topology.physical_cores(reserved)[::-1]
    instances = []
    for index, accelerator in enumerate(accelerators):
        name = f"accelerator-{index}"
        if feeding:
            core = feeding[index % len(feeding)][0]
            cores, nodes = (core,), (topology.node_of(core),)
            notes.append(f"{name} ({accelerator.device}): one feeding thread on service core {core}")
        else:
            cores, nodes = (), ()
            notes.append(f"{name} ({accelerator.device}): one feeding thread, unpinned (no reserved cores)")
        instances.append(InstanceSpec(name, "accelerator", accelerator.device, cores, nodes, 1, engine, 1))
    return instances


def cpu_instances(topology: CpuTopology, reserved: Iterable[int], cpu_layout: str, engine: str) -> list[InstanceSpec]:
    """CPU instances on the usable, non-reserved CPUs: per node, or one TP instance across nodes.

    With no reserved cores the service process (HTTP, tokenization) runs on the instances'
    cores. A multi-threaded instance then stalls at every OpenMP barrier whose thread the
    service preempted (measured here: 2 threads on 2 shared cores served 144 req/s at p99
    0.76 s, two 1-thread instances 197 req/s at p99 0.37 s), so per-node layout splits
    each node into one single-threaded instance per physical core.
    """
    taken = set(reserved)
    free = [[cpu for cpu in node.usable if cpu not in taken] for node in topology.cpu_nodes]
    free = [cpus for cpus in free if cpus]
    if not free:
        return []
    if cpu_layout == "tp":
        free = [[cpu for cpus in free for cpu in cpus]]
    elif not taken:
        free = [list(core) for cpus in free for core in topology.physical_cores(cpus)]
        if topology.is_arm:
            free.reverse()
    return [
        cpu_instance(topology, f"cpu-{index}", "cpu", sorted(cpus, reverse=topology.is_arm), engine)
        for index, cpus in enumerate(free)
    ]


def cpu_instance(
    topology: CpuTopology,
    name: str,
    pool: str,
    cores: Sequence[int],
    engine: str,
    threads: int | None = None,
) -> InstanceSpec:
    """A CPU instance on `cores` (kept in the given order); TP degree = NUMA nodes spanned."""
    nodes = tuple(sorted({topology.node_of(cpu) for cpu in cores}))
    threads = threads or physical_core_count(topology, cores)
    return InstanceSpec(name, pool, "cpu", tuple(cores), nodes, len(nodes), engine, threads)


def physical_core_count(topology: CpuTopology, cpus: Iterable[int]) -> int:
    return len(topology.physical_cores(cpus))
