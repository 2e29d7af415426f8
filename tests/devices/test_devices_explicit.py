"""Explicit plans (settings `plan:` list): any instance on any device and core set, validated."""

from __future__ import annotations

import json

import pytest

from devices import Accelerator, PlanError, make_plan
from windve.settings import InstanceConfig, SettingsError, load_settings

V100 = Accelerator("cuda", 0, "Tesla V100-SXM2-32GB", 32 * 2**30)

TWO_CPU_POOLS = [
    {"pool": "accelerator", "device": "cpu", "cores": [0]},
    {"pool": "cpu", "device": "cpu", "cores": [1]},
]


def test_two_cpu_instances_as_accelerator_and_cpu_pools(hardware_for) -> None:
    plan = make_plan(hardware_for("vm2"), cpu_layout="explicit", explicit=TWO_CPU_POOLS, heterogeneous=True)
    assert plan.heterogeneous is True and plan.layout == "explicit" and plan.reserved_cores == ()
    rows = [(i.pool, i.name, i.device, i.cores, i.numa_nodes, i.tp, i.engine, i.threads) for i in plan.instances]
    assert rows == [
        ("accelerator", "accelerator-0", "cpu", (0,), (0,), 1, "torch", 1),
        ("cpu", "cpu-0", "cpu", (1,), (0,), 1, "torch", 1),
    ]


def test_settings_instance_configs_are_accepted(hardware_for) -> None:
    entries = [InstanceConfig(**entry, engine="onnx", threads=2) for entry in TWO_CPU_POOLS]
    plan = make_plan(hardware_for("vm2"), cpu_layout="explicit", explicit=entries)
    assert [(i.engine, i.threads) for i in plan.instances] == [("onnx", 2), ("onnx", 2)]


def test_both_pools_with_heterogeneous_off_keep_the_accelerator_pool_only(hardware_for) -> None:
    plan = make_plan(hardware_for("vm2"), cpu_layout="explicit", explicit=TWO_CPU_POOLS, heterogeneous=False)
    assert [pool.name for pool in plan.pools] == ["accelerator"] and plan.heterogeneous is False


def test_one_pool_forces_heterogeneous_off(hardware_for) -> None:
    plan = make_plan(hardware_for("vm2"), explicit=TWO_CPU_POOLS[1:], cpu_layout="explicit")
    assert [pool.name for pool in plan.pools] == ["cpu"] and plan.heterogeneous is False


def test_gpu_feeding_core_tp_instance_and_user_core_order(hardware_for) -> None:
    hardware = hardware_for("xeon2s", (V100,))
    entries = [
        {"pool": "accelerator", "device": "cuda:0", "cores": [0]},
        {"pool": "cpu", "device": "cpu", "cores": [*range(23, 0, -1)], "tp": 2, "name": "cpu-tp"},
    ]
    plan = make_plan(hardware, explicit=entries, cpu_layout="explicit", reserved_cores=[0, 24])
    gpu, cpu = plan.instances
    assert (gpu.device, gpu.cores, gpu.threads) == ("cuda:0", (0,), 1)
    assert (cpu.name, cpu.cores[:2], cpu.numa_nodes, cpu.tp, cpu.threads) == ("cpu-tp", (23, 22), (0, 1), 2, 23)
    assert plan.reserved_cores == (0, 24)


def test_plan_list_wins_over_another_layout_with_a_note(hardware_for) -> None:
    plan = make_plan(hardware_for("vm2"), cpu_layout="per-node", explicit=TWO_CPU_POOLS)
    assert plan.layout == "explicit"
    assert any("replaces cpu_layout=per-node" in note for note in plan.notes)


def _entry(**fields):
    return {"pool": "cpu", "device": "cpu", "cores": [1], **fields}


@pytest.mark.parametrize(
    ("machine", "entries", "extra", "message"),
    [
        ("vm2", [_entry(device="gpu:0")], {}, r"plan\[0\] \(cpu-0\): unknown device 'gpu:0'"),
        ("vm2", [_entry(device="cuda")], {}, r"add an index, e.g. cuda:0"),
        ("vm2", [_entry(device="cuda:1")], {"gpu": True}, r"device cuda:1 does not exist \(detected: cuda:0\)"),
        ("vm2", [_entry(device="npu:0")], {}, r"device npu:0 does not exist \(detected: none\)"),
        ("vm2", [_entry(cores=[1, 5, 6])], {}, r"cores 5-6 do not exist \(online CPUs: 0-1\)"),
        ("vm2", [_entry(cores=[0])], {"allowed": "1"}, r"cores 0 are not allowed for this process \(allowed CPUs: 1\)"),
        (
            "vm2",
            [_entry(pool="accelerator", cores=[0, 1]), _entry(cores=[1])],
            {},
            r"instances accelerator-0 and cpu-0 share cores 1",
        ),
        ("xeon2s", [_entry(cores=list(range(24)))], {}, r"tp=1 but its cores 0-23 span NUMA nodes 0-1: tp must be 2"),
        ("xeon2s", [_entry(cores=[1, 2], tp=2)], {}, r"tp=2 but its cores 1-2 span NUMA nodes 0: tp must be 1"),
        ("vm2", [_entry(device="cuda:0", tp=2)], {"gpu": True}, r"tensor parallelism is for cpu instances only"),
        ("vm2", [_entry(cores=[])], {}, r"a cpu instance needs `cores`"),
        ("vm2", [_entry(pool="gpu")], {}, r"pool must be one of accelerator, cpu, got 'gpu'"),
        ("vm2", [_entry(numa=0)], {}, r"unknown keys numa"),
        ("vm2", [_entry(threads=0)], {}, r"threads must be a positive integer, got 0"),
        ("vm2", [_entry(engine="tensorrt")], {}, r"unknown engine 'tensorrt'"),
        ("vm2", [_entry(cores=[0])], {"reserved": [0]}, r"cores 0 are reserved_cores for the service"),
        ("vm2", [_entry(name="a"), _entry(name="a", cores=[0])], {}, r"two instances are named 'a'"),
        ("vm2", [_entry(device="cuda:0", engine="onnx")], {"gpu": True}, r"needs onnxruntime's CUDAExecutionProvider"),
        ("vm2", [], {}, r"the `plan:` list is empty"),
    ],
)
def test_invalid_explicit_plan_names_the_problem(hardware_for, machine, entries, extra, message) -> None:
    hardware = hardware_for(machine, (V100,) if extra.get("gpu") else (), extra.get("allowed"))
    with pytest.raises(PlanError, match=message):
        make_plan(hardware, cpu_layout="explicit", explicit=entries, reserved_cores=extra.get("reserved"))


def test_names_from_the_plan_setting_reach_the_instances(hardware_for, monkeypatch) -> None:
    monkeypatch.setenv(
        "WINDVE_PLAN", '[{"pool": "accelerator", "cores": [0], "name": "fast"}, {"pool": "cpu", "cores": [1]}]'
    )
    settings = load_settings(cpu_layout="explicit")
    plan = make_plan(hardware_for("vm2"), cpu_layout="explicit", explicit=settings.plan)
    assert [i.name for i in plan.instances] == ["fast", "cpu-0"]


def test_the_service_notes_that_a_plan_setting_replaced_the_layout(hardware_for, monkeypatch) -> None:
    # The service had passed cpu_layout=explicit whenever `plan:` was set, so the note never came.
    from windve.service import make_plan as service_plan

    monkeypatch.setenv("WINDVE_PLAN", '[{"pool": "cpu", "cores": [1]}]')
    plan = service_plan(load_settings(cpu_layout="tp"), hardware_for("vm2"))
    assert plan.layout == "explicit"
    assert any("replaces cpu_layout=tp" in note for note in plan.notes), plan.notes
    # the default layout, not set by anyone, gets no note
    assert not [note for note in service_plan(load_settings(), hardware_for("vm2")).notes if "replaces" in note]


@pytest.mark.parametrize("name", ["", "has space", "-dash-first", "x" * 65])
def test_a_name_that_cannot_be_a_label_is_refused_naming_the_setting(monkeypatch, name) -> None:
    monkeypatch.setenv("WINDVE_PLAN", json.dumps([{"pool": "cpu", "cores": [0], "name": name}]))
    with pytest.raises(SettingsError, match=r"plan\.0\.name"):
        load_settings(cpu_layout="explicit")
