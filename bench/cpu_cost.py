"""CPU seconds each process of a served run spends per answered request, by role.

Read from /proc (user + system time of every thread, children not included) before and after
a load: the serving parent, its front-end processes and its engine processes, and the load
generator's own CPU from the caller's reaped children (`resource.RUSAGE_CHILDREN`). Divided by
the 200s, it is the host path's cost per request on this machine, a figure that carries across
hosts better than requests/s: a process whose cost per request is X us can serve at most
1 / X requests a second on one core, whatever else shares the machine.
"""

from __future__ import annotations

import os
import resource
from collections import defaultdict
from dataclasses import dataclass, field

from windve.engine_process.usage import process_usage

# What the module a process runs says about its role (its command line).
ROLES = (("windve.frontend.process", "front end"), ("windve.engine_process.worker", "engine"))
PARENT = "serve"  # the `windve serve` process: the dispatcher (and the front end when it is one process)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree[parent].append(int(entry))
    return tree


def _role(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return next((role for module, role in ROLES if module in command), None)


@dataclass
class Snapshot:
    seconds: dict[int, tuple[str, float]] = field(default_factory=dict)  # pid -> (role, CPU seconds)
    children_seconds: float = 0.0  # this process's reaped children (wrk)


def snapshot(serve_pid: int) -> Snapshot:
    taken = Snapshot()
    usage = process_usage(serve_pid)
    if usage is not None:
        taken.seconds[serve_pid] = (PARENT, usage[1])
    tree, todo = _children(), [serve_pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            todo.append(child)
            role, usage = _role(child), process_usage(child)
            if role is not None and usage is not None:
                taken.seconds[child] = (role, usage[1])
    rusage = resource.getrusage(resource.RUSAGE_CHILDREN)
    taken.children_seconds = rusage.ru_utime + rusage.ru_stime
    return taken


def cost_per_request(before: Snapshot, after: Snapshot, answered: int) -> dict[str, dict]:
    """Per role: processes, CPU seconds and microseconds per answered request (summed over the
    role's processes; 'load' is the load generator). Processes that started or ended meanwhile
    are left out."""
    by_role: dict[str, dict] = {}
    for pid, (role, seconds) in after.seconds.items():
        if pid not in before.seconds:
            continue
        entry = by_role.setdefault(role, {"processes": 0, "cpu_s": 0.0})
        entry["processes"] += 1
        entry["cpu_s"] += seconds - before.seconds[pid][1]
    by_role["load"] = {"processes": 1, "cpu_s": after.children_seconds - before.children_seconds}
    for entry in by_role.values():
        entry["us_per_request"] = entry["cpu_s"] / answered * 1e6 if answered else None
    return by_role


def describe(by_role: dict[str, dict]) -> str:
    """One line: e.g. 'CPU us per 200: serve 480, front end (2 processes) 720, engine (2) 1,900, load 150'."""
    parts = []
    for role in (PARENT, "front end", "engine", "load"):
        entry = by_role.get(role)
        if entry is None or entry["us_per_request"] is None:
            continue
        count = f" ({entry['processes']})" if entry["processes"] > 1 else ""
        parts.append(f"{role}{count} {entry['us_per_request']:,.0f}")
    return "CPU us per 200 (summed over a role's processes): " + (", ".join(parts) if parts else "no 200s")
