"""Automatic plans on fixture machines: pools, reserved cores, per-instance cores.

Accelerators are simulated by handing make_plan a Hardware value that lists one; nothing here
claims such a device exists on the machine running the tests.
"""

from __future__ import annotations

import itertools
import json

import pytest

from devices import Accelerator, PlanError, make_plan, render_text
from devices.cpulist import format_cpulist, parse_cpulist

V100 = Accelerator("cuda", 0, "Tesla V100-SXM2-32GB", 32 * 2**30)
V100_1 = Accelerator("cuda", 1, "Tesla V100-SXM2-32GB", 32 * 2**30)
ASCEND = Accelerator("npu", 0, "Ascend910B", 64 * 2**30)


def _rows(plan) -> dict[str, list[tuple]]:
    """pool -> [(device, cores as listed, numa nodes, tp, threads)] for compact expectations."""
    return {
        pool.name: [(i.device, i.cores, i.numa_nodes, i.tp, i.threads) for i in pool.instances] for pool in plan.pools
    }


def _down(first: int, last: int) -> tuple[int, ...]:
    return tuple(range(first, last - 1, -1))


def _cpus(text: str) -> tuple[int, ...]:
    return tuple(sorted(parse_cpulist(text)))


CASES = [
    # id, machine, allowed, accelerators, layout, reserved, expected rows
    # Nothing reserved: the service shares the cores, so one 1-thread instance per core.
    ("vm2", "vm2", None, (), "per-node", "", {"cpu": [("cpu", (0,), (0,), 1, 1), ("cpu", (1,), (0,), 1, 1)]}),
    ("vm2 tp", "vm2", None, (), "tp", "", {"cpu": [("cpu", (0, 1), (0,), 1, 2)]}),
    (
        "vm2+gpu",
        "vm2", None, (V100,), "per-node", "0",
        {"accelerator": [("cuda:0", (0,), (0,), 1, 1)], "cpu": [("cpu", (1,), (0,), 1, 1)]},
    ),
    (
        "kunpeng",
        "kunpeng920", None, (), "per-node", "0-11",
        {"cpu": [
            ("cpu", _down(47, 12), (0,), 1, 36),
            ("cpu", _down(95, 48), (1,), 1, 48),
            ("cpu", _down(143, 96), (2,), 1, 48),
            ("cpu", _down(191, 144), (3,), 1, 48),
        ]},
    ),
    (
        "kunpeng+npu",
        "kunpeng920", None, (ASCEND,), "per-node", "0-47",
        {"accelerator": [("npu:0", (47,), (0,), 1, 1)], "cpu": [
            ("cpu", _down(95, 48), (1,), 1, 48),
            ("cpu", _down(143, 96), (2,), 1, 48),
            ("cpu", _down(191, 144), (3,), 1, 48),
        ]},
    ),
    (
        "kunpeng+npu tp",
        "kunpeng920", None, (ASCEND,), "tp", "0-47",
        {"accelerator": [("npu:0", (47,), (0,), 1, 1)], "cpu": [("cpu", _down(191, 48), (1, 2, 3), 3, 144)]},
    ),
    (
        "kunpeng tp",
        "kunpeng920", None, (), "tp", "0-11",
        {"cpu": [("cpu", _down(191, 12), (0, 1, 2, 3), 4, 180)]},
    ),
    (
        "xeon",
        "xeon2s", None, (), "per-node", "0,24",
        {"cpu": [("cpu", _cpus("1-11,25-35"), (0,), 1, 11), ("cpu", _cpus("12-23,36-47"), (1,), 1, 12)]},
    ),
    (
        "xeon+gpu",
        "xeon2s", None, (V100,), "per-node", "0-11,24-35",
        {"accelerator": [("cuda:0", (11,), (0,), 1, 1)], "cpu": [("cpu", _cpus("12-23,36-47"), (1,), 1, 12)]},
    ),
    (
        "xeon+2gpu",
        "xeon2s", None, (V100, V100_1), "per-node", "0-11,24-35",
        {
            "accelerator": [("cuda:0", (11,), (0,), 1, 1), ("cuda:1", (10,), (0,), 1, 1)],
            "cpu": [("cpu", _cpus("12-23,36-47"), (1,), 1, 12)],
        },
    ),
    (
        "xeon tp",
        "xeon2s", None, (), "tp", "0,24",
        {"cpu": [("cpu", _cpus("1-23,25-47"), (0, 1), 2, 23)]},
    ),
    (
        "gapped",
        "gapped", None, (), "per-node", "0-1",
        {"cpu": [("cpu", _cpus("2-15"), (0,), 1, 14), ("cpu", _cpus("16-31"), (2,), 1, 16)]},
    ),
    (
        "gapped+gpu",
        "gapped", None, (V100,), "per-node", "0-15",
        {"accelerator": [("cuda:0", (15,), (0,), 1, 1)], "cpu": [("cpu", _cpus("16-31"), (2,), 1, 16)]},
    ),
    (
        "gapped+gpu tp",
        "gapped", None, (V100,), "tp", "0-15",
        {"accelerator": [("cuda:0", (15,), (0,), 1, 1)], "cpu": [("cpu", _cpus("16-31"), (2,), 1, 16)]},
    ),
    (
        "container two nodes",
        "xeon2s", "6-17,30-41", (), "per-node", "6,30",
        {"cpu": [("cpu", _cpus("7-11,31-35"), (0,), 1, 5), ("cpu", _cpus("12-17,36-41"), (1,), 1, 6)]},
    ),
    (
        "container two nodes+gpu",
        "xeon2s", "6-17,30-41", (V100,), "per-node", "6-11,30-35",
        {"accelerator": [("cuda:0", (11,), (0,), 1, 1)], "cpu": [("cpu", _cpus("12-17,36-41"), (1,), 1, 6)]},
    ),
    (
        "container one node, no siblings",
        "xeon2s", "0-3", (), "per-node", "",
        {"cpu": [("cpu", (core,), (0,), 1, 1) for core in range(4)]},
    ),
    (
        "small arm container",
        "kunpeng920", "40-43", (), "per-node", "",
        {"cpu": [("cpu", (core,), (0,), 1, 1) for core in (43, 42, 41, 40)]},
    ),
    (
        "container one node+gpu",
        "xeon2s", "0-3", (V100,), "per-node", "0-2",
        {"accelerator": [("cuda:0", (2,), (0,), 1, 1)], "cpu": [("cpu", (3,), (0,), 1, 1)]},
    ),
    (
        "container on arm",
        "kunpeng920", "40-55", (), "per-node", "40",
        {"cpu": [("cpu", _down(47, 41), (0,), 1, 7), ("cpu", _down(55, 48), (1,), 1, 8)]},
    ),
]


@pytest.mark.parametrize(
    ("machine", "allowed", "accelerators", "layout", "reserved", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_automatic_plan(hardware_for, machine, allowed, accelerators, layout, reserved, expected) -> None:
    hardware = hardware_for(machine, accelerators, allowed)
    plan = make_plan(hardware, cpu_layout=layout, heterogeneous=True)
    assert format_cpulist(plan.reserved_cores) == reserved
    assert _rows(plan) == expected
    assert plan.heterogeneous == (len(expected) == 2)
    assert [pool.name for pool in plan.pools] == [name for name in ("accelerator", "cpu") if name in expected]


def _all_plans(hardware_for):
    machines = [("vm2", None), ("kunpeng920", None), ("xeon2s", None), ("gapped", None), ("xeon2s", "6-17,30-41")]
    for (machine, allowed), accelerators, layout in itertools.product(machines, [(), (V100,)], ["per-node", "tp"]):
        hardware = hardware_for(machine, accelerators, allowed)
        yield hardware, make_plan(hardware, cpu_layout=layout)


def test_invariants_hold_for_every_fixture_plan(hardware_for) -> None:
    for hardware, plan in _all_plans(hardware_for):
        topology = hardware.topology
        taken: set[int] = set(plan.reserved_cores)
        for instance in plan.instances:
            if not instance.on_cpu:
                assert set(instance.cores) <= set(plan.reserved_cores)  # feeding thread on a service core
                continue
            cores = instance.cores
            assert set(cores) <= set(topology.usable)
            assert not taken & set(cores), f"{instance.name} overlaps reserved cores or another instance"
            taken |= set(cores)
            nodes = {topology.node_of(core) for core in cores}
            assert instance.numa_nodes == tuple(sorted(nodes))
            assert instance.tp == len(nodes)  # spans nodes only as TP, one rank per node
            assert instance.threads == len(topology.physical_cores(cores))
            assert list(cores) == sorted(cores, reverse=topology.is_arm)
            memory_only = {node.id for node in topology.nodes if node.memory_only}
            assert not memory_only & nodes
        json.loads(json.dumps(plan.to_dict()))  # JSON-serialisable


@pytest.mark.parametrize(
    ("accelerators", "heterogeneous", "pools", "mixed"),
    [
        ((), True, ["cpu"], False),  # one kind: heterogeneous forced off
        ((), False, ["cpu"], False),
        ((V100,), False, ["accelerator"], False),  # both kinds, off: accelerator only
        ((V100,), True, ["accelerator", "cpu"], True),  # both kinds, on: both pools
    ],
)
def test_heterogeneous_rules(hardware_for, accelerators, heterogeneous, pools, mixed) -> None:
    plan = make_plan(hardware_for("xeon2s", accelerators), heterogeneous=heterogeneous)
    assert [pool.name for pool in plan.pools] == pools
    assert plan.heterogeneous is mixed
    if heterogeneous and not mixed:
        assert any("heterogeneous forced off" in note for note in plan.notes)


def test_accelerator_without_cpu_cores_left_is_one_kind(hardware_for) -> None:
    # One allowed CPU: the three-quarters rule reserves it, so no CPU pool can exist.
    plan = make_plan(hardware_for("xeon2s", (V100,), allowed="5"), heterogeneous=True)
    assert [pool.name for pool in plan.pools] == ["accelerator"]
    assert plan.heterogeneous is False and plan.reserved_cores == (5,)


@pytest.mark.parametrize(("allowed", "reserved"), [("0-3", (0, 1, 2, 3)), (None, tuple(range(48)))])
def test_accelerator_without_cpu_pool_reserves_every_core_for_its_host_path(hardware_for, allowed, reserved) -> None:
    plan = make_plan(hardware_for("xeon2s", (V100,), allowed=allowed), heterogeneous=False)
    assert [pool.name for pool in plan.pools] == ["accelerator"]
    assert plan.reserved_cores == reserved
    assert any("no CPU pool" in note for note in plan.notes)


def test_device_cpu_ignores_accelerators_and_uses_cpu_reservation(hardware_for) -> None:
    plan = make_plan(hardware_for("xeon2s", (V100,)), device="cpu")
    assert [pool.name for pool in plan.pools] == ["cpu"]
    assert plan.reserved_cores == (0, 24)


def test_device_auto_prefers_cuda_and_device_npu_picks_npus(hardware_for) -> None:
    hardware = hardware_for("kunpeng920", (ASCEND, V100))
    assert [i.device for i in make_plan(hardware).pools[0].instances] == ["cuda:0"]
    assert [i.device for i in make_plan(hardware, device="npu").pools[0].instances] == ["npu:0"]


@pytest.mark.parametrize(("device", "accelerators"), [("cuda", ()), ("npu", (V100,))])
def test_requested_accelerator_kind_missing_is_an_error(hardware_for, device, accelerators) -> None:
    with pytest.raises(PlanError, match=f"device={device} but no .* was detected"):
        make_plan(hardware_for("vm2", accelerators), device=device)


def test_configured_reserved_cores_replace_the_rule(hardware_for) -> None:
    plan = make_plan(hardware_for("xeon2s", (V100,)), reserved_cores=[0, 1])
    assert plan.reserved_cores == (0, 1)
    node0 = plan.pool("cpu").instances[0]
    # 24 and 25 are siblings of reserved cores: usable, but counted as the physical cores they are
    assert format_cpulist(node0.cores) == "2-11,24-35" and node0.threads == 12


def test_no_reserved_cores_leaves_feeding_thread_unpinned(hardware_for) -> None:
    plan = make_plan(hardware_for("xeon2s", (V100,)), reserved_cores=[])
    assert plan.reserved_cores == ()
    assert plan.pool("accelerator").instances[0].cores == ()
    assert any("unpinned" in note for note in plan.notes)
    # The service shares every core: one single-threaded instance per physical core (2 SMT CPUs).
    assert [(len(i.cores), i.threads) for i in plan.pool("cpu").instances] == [(2, 1)] * 24


@pytest.mark.parametrize(
    ("reserved", "allowed", "message"),
    [([99], None, "cores 99 do not exist"), ([1], "2-5", "cores 1 are not allowed"), (["x"], None, "CPU numbers")],
)
def test_bad_reserved_cores(hardware_for, reserved, allowed, message) -> None:
    with pytest.raises(PlanError, match=message):
        make_plan(hardware_for("xeon2s", allowed=allowed), reserved_cores=reserved)


@pytest.mark.parametrize(
    ("option", "value"), [("device", "gpu"), ("cpu_layout", "per-socket"), ("engine", "tensorrt")]
)
def test_unknown_choice_is_named(hardware_for, option, value) -> None:
    with pytest.raises(PlanError, match=f"unknown {option} '{value}'"):
        make_plan(hardware_for("vm2"), **{option: value})


def test_onnx_on_gpu_needs_cuda_provider(hardware_for) -> None:
    with pytest.raises(PlanError, match="needs onnxruntime's CUDAExecutionProvider"):
        make_plan(hardware_for("vm2", (V100,)), engine="onnx")
    with_provider = hardware_for("vm2", (V100,), providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    assert make_plan(with_provider, engine="onnx").pools[0].instances[0].engine == "onnx"


def test_onnx_without_onnxruntime_says_which_extra_to_install(hardware_for) -> None:
    # onnxruntime is an extra (windve[onnx] / windve[onnx-gpu]): a plain install runs the torch
    # engine, and asking for onnx there is refused at start, not when the engine loads.
    with pytest.raises(PlanError, match=r"onnxruntime is not installed\); pip install 'windve\[onnx\]'"):
        make_plan(hardware_for("vm2", providers=()), engine="onnx")
    with pytest.raises(PlanError, match=r"CUDAExecutionProvider .*pip install 'windve\[onnx-gpu\]'"):
        make_plan(hardware_for("vm2", (V100,), providers=()), engine="onnx")
    assert make_plan(hardware_for("vm2", providers=()), engine="torch").pools


def test_text_report_shows_pools_reserved_cores_and_order(hardware_for) -> None:
    hardware = hardware_for("kunpeng920", (ASCEND,))
    text = render_text(hardware, make_plan(hardware))
    assert "reserved service cores: 0-47" in text
    assert "heterogeneous on" in text
    lines = [line.split() for line in text.splitlines()]
    assert ["accelerator", "accelerator-0", "npu:0", "torch", "1", "1", "0", "47"] in lines
    assert ["cpu", "cpu-2", "cpu", "torch", "1", "48", "3", "144-191", "(highest", "first)"] in lines


def test_tp_instance_splits_into_one_rank_per_node(hardware_for) -> None:
    hardware = hardware_for("kunpeng920")
    (instance,) = make_plan(hardware, cpu_layout="tp", device="cpu").pool("cpu").instances
    ranks = hardware.topology.cores_by_node(instance.cores)
    assert list(ranks) == list(instance.numa_nodes) == [0, 1, 2, 3]
    assert ranks[0] == _down(47, 12) and ranks[3] == _down(191, 144)
