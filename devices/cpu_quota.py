"""The CPU time this process's cgroup may use: a container's CPU limit.

A Kubernetes CPU limit is a CFS quota, not a CPU set: a pod limited to 16 CPUs on a 48-CPU node
still has all 48 in its affinity unless the kubelet's static CPU manager gives it exclusive
cores. A plan over the affinity then runs more busy threads than the quota pays for, and the
kernel stops all of them for the rest of each period once it is spent: the tail latency the SLO
is about. The topology reader notes it (topology.py); planning stays over the affinity, since
which CPUs to keep is the operator's choice (an explicit plan, or exclusive cores).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def cpu_quota(
    cgroup_root: str | Path = "/sys/fs/cgroup", proc_cgroup: str | Path = "/proc/self/cgroup"
) -> float | None:
    """CPUs' worth of time per period this process may use (the tightest quota of its cgroup and
    those above it, cgroup v2 or v1), or None when there is none or it cannot be read."""
    root = Path(cgroup_root)
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    quotas = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2: "0::/path"
            quotas += _walk(root, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # v1: "4:cpu,cpuacct:/path"
            quotas += _walk(root / controllers, path, _v1_quota)
            quotas += _walk(root / "cpu", path, _v1_quota)
    return min(quotas, default=None)


def _walk(base: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """The quotas found in `path`'s directory under `base` and every directory above it. In a
    container with its own cgroup namespace, `path` is "/" and `base` is the container's cgroup."""
    parts = [part for part in path.strip("/").split("/") if part]
    found = []
    for depth in range(len(parts), -1, -1):
        quota = read(base.joinpath(*parts[:depth]))
        if quota is not None:
            found.append(quota)
    return found


def _v2_quota(directory: Path) -> float | None:
    try:
        quota, _, period = (directory / "cpu.max").read_text().strip().partition(" ")
    except OSError:
        return None
    if quota == "max" or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return int(quota) / int(period)


def _v1_quota(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
