"""A container's CPU limit (a CFS quota) read from its cgroup, and noted where it is below the CPUs
the topology would plan over."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices import read_topology
from devices.cpu_quota import cpu_quota


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_takes_the_tightest_quota_on_the_way_to_the_root(tmp_path) -> None:
    write(tmp_path / "proc", "0::/kubepods/pod1/ctr\n")
    write(tmp_path / "cg/kubepods/cpu.max", "max 100000\n")
    write(tmp_path / "cg/kubepods/pod1/cpu.max", "1600000 100000\n")  # 16 CPUs: the pod's limit
    write(tmp_path / "cg/kubepods/pod1/ctr/cpu.max", "max 100000\n")
    assert cpu_quota(tmp_path / "cg", tmp_path / "proc") == 16.0
    write(tmp_path / "cg/kubepods/cpu.max", "250000 100000\n")
    assert cpu_quota(tmp_path / "cg", tmp_path / "proc") == 2.5


def test_a_container_with_its_own_cgroup_namespace_reads_its_root(tmp_path) -> None:
    write(tmp_path / "proc", "0::/\n")
    write(tmp_path / "cg/cpu.max", "50000 100000\n")
    assert cpu_quota(tmp_path / "cg", tmp_path / "proc") == 0.5


def test_cgroup_v1_reads_the_cfs_files(tmp_path) -> None:
    write(tmp_path / "proc", "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    write(tmp_path / "cg/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "400000\n")
    write(tmp_path / "cg/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cpu_quota(tmp_path / "cg", tmp_path / "proc") == 4.0


@pytest.mark.parametrize(
    ("files", "why"),
    [({"cg/cpu.max": "max 100000\n"}, "no limit"),
     ({"cg/cpu/cpu.cfs_quota_us": "-1\n", "cg/cpu/cpu.cfs_period_us": "100000\n"}, "v1, no limit"),
     ({"cg/cpu.max": "garbage\n"}, "unreadable"),
     ({}, "no cgroup files")],
)  # fmt: skip
def test_no_quota_reads_as_none(tmp_path, files: dict[str, str], why: str) -> None:
    write(tmp_path / "proc", "1:cpu:/\n0::/\n")
    for relative, text in files.items():
        write(tmp_path / relative, text)
    assert cpu_quota(tmp_path / "cg", tmp_path / "proc") is None, why
    assert cpu_quota(tmp_path / "cg", tmp_path / "missing") is None


def test_a_quota_below_this_process_cpus_is_noted(fresh_tree) -> None:
    # The tree's cgroup (under the sysfs root, as /sys/fs/cgroup) limits this process to half a
    # CPU: fewer than any affinity. Whatever this process's cgroup path, the walk reaches the root.
    root = fresh_tree("kunpeng920")
    (root / "fs/cgroup").mkdir(parents=True)
    (root / "fs/cgroup/cpu.max").write_text("50000 100000\n")
    (note,) = [note for note in read_topology(root).notes if "CPU quota" in note]
    assert note.startswith("this process may use 0.5 CPUs' time") and "static CPU manager" in note
    # Another machine's tree (CPUs given, or "all") is not this process's: no quota applies.
    assert not [note for note in read_topology(root, allowed_cpus="all").notes if "CPU quota" in note]
