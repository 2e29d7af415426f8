"""Hardware and plan as a readable table (`windve detect`, the serve log) or as JSON (`--json`, /info)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from devices.cpulist import format_cpulist
from devices.hardware import Hardware
from devices.specs import Plan


def report_dict(hardware: Hardware, plan: Plan | None) -> dict:
    return {"hardware": hardware.to_dict(), "plan": plan.to_dict() if plan is not None else None}


def render_json(hardware: Hardware, plan: Plan | None) -> str:
    return json.dumps(report_dict(hardware, plan), indent=2)


def render_text(hardware: Hardware, plan: Plan | None) -> str:
    """Hardware, NUMA nodes, the plan and every note, as aligned plain-text tables."""
    sections = [render_hardware(hardware)]
    if plan is not None:
        sections.append(render_plan(plan, arm=hardware.topology.is_arm))
    notes = [*hardware.notes, *hardware.topology.notes, *(plan.notes if plan else ())]
    if notes:
        sections.append("Notes\n" + "\n".join(f"  - {note}" for note in notes))
    return "\n\n".join(sections) + "\n"


def render_hardware(hardware: Hardware) -> str:
    topology = hardware.topology
    accelerators = ", ".join(
        f"{acc.device} {acc.name}" + (f" ({_gib(acc.memory_bytes)})" if acc.memory_bytes else "")
        for acc in hardware.accelerators
    )
    order = " (CPU instances take cores highest index first)" if topology.is_arm else ""
    summary = _table(
        [
            ("architecture", topology.arch + order),
            ("accelerators", accelerators or "none"),
            ("onnxruntime", ", ".join(hardware.onnx_providers) or "not available"),
            (
                "CPUs",
                f"{len(topology.online)} online, {len(topology.usable)} usable, "
                f"{len(topology.physical_cores(topology.usable))} usable physical cores, "
                f"{len(topology.packages) or '?'} package(s)",
            ),
            ("sysfs root", topology.sysfs_root),
        ],
        indent="  ",
    )
    nodes = _table(
        [("NUMA node", "CPUs", "usable", "memory", "distances")]
        + [
            (
                str(node.id),
                format_cpulist(node.cpus) or "-",
                format_cpulist(node.usable) or "-",
                _gib(node.memory_kb * 1024) if node.memory_kb is not None else "?",
                " ".join(str(distance) for distance in node.distances.values())
                + ("  (memory only)" if node.memory_only else ""),
            )
            for node in topology.nodes
        ],
        indent="  ",
    )
    return f"Hardware\n{summary}\n\n{nodes}"


def render_plan(plan: Plan, arm: bool = False) -> str:
    """The plan alone (what `windve serve` logs at start)."""
    pools = ", ".join(pool.name for pool in plan.pools)
    heading = (
        f"Plan: pools {pools} (priority order), heterogeneous {'on' if plan.heterogeneous else 'off'}, "
        f"layout {plan.layout}\n  reserved service cores: {format_cpulist(plan.reserved_cores) or 'none'}"
    )
    rows: list[Sequence[str]] = [("pool", "instance", "device", "engine", "tp", "threads", "NUMA", "cores")]
    for instance in plan.instances:
        cores = format_cpulist(instance.cores) or "-"
        if arm and instance.on_cpu and len(instance.cores) > 1 and instance.cores[0] > instance.cores[-1]:
            cores += " (highest first)"
        rows.append(
            (
                instance.pool,
                instance.name,
                instance.device,
                instance.engine,
                str(instance.tp),
                str(instance.threads),
                format_cpulist(instance.numa_nodes) or "-",
                cores,
            )
        )
    return heading + "\n\n" + _table(rows, indent="  ")


def _table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    )


def _gib(size_bytes: int) -> str:
    return f"{size_bytes / 2**30:.1f} GiB"
