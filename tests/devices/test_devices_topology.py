"""Reading CPU/NUMA topology from sysfs trees shaped like real machines, and from this machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devices import DeviceError, detect_hardware, read_topology
from devices.cpulist import format_cpulist, parse_cpulist


@pytest.mark.parametrize(
    ("machine", "arch", "nodes", "physical_cores", "packages"),
    [
        ("vm2", "x86_64", {0: "0-1"}, 2, (0,)),
        ("kunpeng920", "aarch64", {0: "0-47", 1: "48-95", 2: "96-143", 3: "144-191"}, 192, (0, 1)),
        ("xeon2s", "x86_64", {0: "0-11,24-35", 1: "12-23,36-47"}, 24, (0, 1)),
        ("gapped", "x86_64", {0: "0-15", 2: "16-31", 3: ""}, 32, (0, 1)),
    ],
)
def test_reads_nodes_cpus_and_cores(sysfs_tree, machine, arch, nodes, physical_cores, packages) -> None:
    topology = read_topology(sysfs_tree(machine), allowed_cpus="all", arch=arch)
    assert {node.id: format_cpulist(node.cpus) for node in topology.nodes} == nodes
    assert len(topology.physical_cores(topology.usable)) == physical_cores
    assert topology.packages == packages
    assert topology.is_arm == (arch == "aarch64")
    assert topology.notes == ()


def test_smt_siblings_form_one_physical_core(sysfs_tree) -> None:
    topology = read_topology(sysfs_tree("xeon2s"), allowed_cpus="all", arch="x86_64")
    assert topology.cpus[0].siblings == (0, 24)
    assert topology.cpus[36].siblings == (12, 36)
    assert topology.cpus[36].node == 1 and topology.cpus[36].package == 1
    assert topology.cpus[0].core_id == topology.cpus[24].core_id
    assert topology.physical_cores([0, 1, 24, 30]) == [(0, 24), (1,), (30,)]  # only the given CPUs


def test_distances_keyed_by_real_node_ids(sysfs_tree) -> None:
    topology = read_topology(sysfs_tree("kunpeng920"), allowed_cpus="all", arch="aarch64")
    assert dict(topology.nodes[1].distances) == {0: 12, 1: 10, 2: 22, 3: 24}
    gapped = read_topology(sysfs_tree("gapped"), allowed_cpus="all", arch="x86_64")
    assert dict(gapped.nodes[2].distances) == {0: 14, 2: 24, 3: 10}


def test_memory_only_node_has_memory_and_no_cpus(sysfs_tree) -> None:
    topology = read_topology(sysfs_tree("gapped"), allowed_cpus="all", arch="x86_64")
    by_id = {node.id: node for node in topology.nodes}
    assert by_id[3].memory_only and by_id[3].memory_kb == 268_435_456
    assert not by_id[0].memory_only and by_id[0].memory_kb == 65_536_000
    assert [node.id for node in topology.cpu_nodes] == [0, 2]


@pytest.mark.parametrize(
    ("allowed", "usable_by_node"),
    [
        ("6-17,30-41", {0: "6-11,30-35", 1: "12-17,36-41"}),
        ("0-3", {0: "0-3", 1: ""}),
        ("12-23,100-200", {0: "", 1: "12-23"}),  # CPUs that are not online are ignored
    ],
)
def test_container_allowed_subset_limits_usable_cpus(sysfs_tree, allowed, usable_by_node) -> None:
    topology = read_topology(sysfs_tree("xeon2s"), allowed_cpus=parse_cpulist(allowed), arch="x86_64")
    assert {node.id: format_cpulist(node.usable) for node in topology.nodes} == usable_by_node
    assert len(topology.online) == 48  # the machine is still described whole


def test_default_allowed_set_is_this_process_affinity(sysfs_tree) -> None:
    topology = read_topology(sysfs_tree("kunpeng920"))
    assert set(topology.usable) == os.sched_getaffinity(0) & set(range(192))


def test_no_allowed_cpu_online_is_an_error(sysfs_tree) -> None:
    with pytest.raises(DeviceError, match=r"none of the allowed CPUs \(200-201\) is online"):
        read_topology(sysfs_tree("vm2"), allowed_cpus={200, 201})


def test_without_numa_directory_all_cpus_form_node_zero(fresh_tree) -> None:
    root = fresh_tree("xeon2s")
    _remove_tree(root / "devices/system/node")
    topology = read_topology(root, allowed_cpus="all", arch="x86_64")
    assert [(node.id, format_cpulist(node.cpus)) for node in topology.nodes] == [(0, "0-47")]
    assert any("node/online is missing" in note for note in topology.notes)


def test_without_smt_information_each_cpu_is_a_core(fresh_tree) -> None:
    root = fresh_tree("xeon2s")
    for cpu in range(48):
        (root / f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").unlink()
    topology = read_topology(root, allowed_cpus="all", arch="x86_64")
    assert len(topology.physical_cores(topology.usable)) == 48
    assert len([note for note in topology.notes if "no SMT information" in note]) == 1


def test_missing_distance_and_meminfo_are_unknown_not_errors(fresh_tree) -> None:
    root = fresh_tree("vm2")
    (root / "devices/system/node/node0/distance").unlink()
    (root / "devices/system/node/node0/meminfo").unlink()
    node = read_topology(root, allowed_cpus="all").nodes[0]
    assert node.distances == {} and node.memory_kb is None


@pytest.mark.parametrize(
    ("relative", "content", "message"),
    [
        ("devices/system/cpu/online", "0-x", "bad CPU list item '0-x'"),
        ("devices/system/cpu/online", None, "is missing"),
        ("devices/system/node/online", "nodes", "bad CPU list item 'nodes'"),
        ("devices/system/node/online", "", "lists no node"),
        ("devices/system/node/node1/cpulist", "23-12", "bad CPU range '23-12'"),
        ("devices/system/node/node1/cpulist", None, "is missing"),
        ("devices/system/node/node1/cpulist", "0-23", "CPU 0 is also listed by node 0"),
        ("devices/system/node/node0/distance", "10", "expected 2 integer distances"),
        ("devices/system/node/node0/distance", "10 twenty", "expected 2 integer distances"),
        ("devices/system/node/node1/meminfo", "Node 1 MemFree: 12 kB", "no 'Node 1 MemTotal"),
        ("devices/system/cpu/cpu3/topology/core_id", "three", "expected an integer, got 'three'"),
        ("devices/system/cpu/cpu3/topology/physical_package_id", "", "expected an integer, got ''"),
        ("devices/system/cpu/cpu3/topology/thread_siblings_list", "4,28", "does not list CPU 3 itself"),
        ("devices/system/cpu/cpu3/topology/thread_siblings_list", "3;27", "bad CPU list item '3;27'"),
    ],
)
def test_malformed_or_missing_file_names_the_file(fresh_tree, relative, content, message) -> None:
    root = fresh_tree("xeon2s")
    path = root / relative
    if content is None:
        path.unlink()
    else:
        path.write_text(content + "\n")
    with pytest.raises(DeviceError) as caught:
        read_topology(root, allowed_cpus="all")
    assert str(path) in str(caught.value)
    assert message in str(caught.value)


def test_unreadable_file_is_a_device_error(fresh_tree) -> None:
    root = fresh_tree("vm2")
    path = root / "devices/system/node/node0/cpulist"
    path.unlink()
    path.mkdir()  # reading a directory fails with EISDIR, as a permission problem would
    with pytest.raises(DeviceError, match=f"cannot read {path}"):
        read_topology(root, allowed_cpus="all")


def test_this_machine() -> None:
    """The real /sys: every CPU this process may use, and only accelerators that exist."""
    hardware = detect_hardware()
    topology = hardware.topology
    assert set(topology.usable) == os.sched_getaffinity(0)
    assert len(topology.online) == os.cpu_count()
    has_gpu_nodes = any(Path("/dev").glob("nvidia[0-9]*")) or any(Path("/dev").glob("davinci[0-9]*"))
    if not has_gpu_nodes:  # this VM: 2 vCPUs, no GPU/NPU device nodes
        assert hardware.accelerators == ()
    assert "CPUExecutionProvider" in hardware.onnx_providers


def _remove_tree(path: Path) -> None:
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    path.rmdir()
