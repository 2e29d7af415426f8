"""`windve detect` as a real process: tables, JSON, config-file plans, clear errors."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from windve.commands import detect

README_PLAN = """\
heterogeneous: true
cpu_layout: explicit
plan:
  - pool: accelerator   # a CPU engine standing in for the accelerator
    device: cpu
    cores: [0]
  - pool: cpu
    device: cpu
    cores: [1]
    engine: onnx
"""


def _detect(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("WINDVE_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "windve.commands.detect", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )


def test_json_on_this_machine() -> None:
    result = _detect("--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report["hardware"]["cpu"]["usable"]) == os.sched_getaffinity(0)
    if not any(Path("/dev").glob("nvidia[0-9]*")) and not any(Path("/dev").glob("davinci[0-9]*")):
        assert report["hardware"]["accelerators"] == []
        assert [pool["name"] for pool in report["plan"]["pools"]] == ["cpu"]
        assert report["plan"]["heterogeneous"] is False


def test_python_dash_m_windve_is_the_windve_command() -> None:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("WINDVE_")}
    result = subprocess.run([sys.executable, "-m", "windve", "detect", "--json"], capture_output=True, text=True,
                            env=environment, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["plan"] == json.loads(_detect("--json").stdout)["plan"]


def test_previews_another_machine_from_its_sysfs_tree(sysfs_tree) -> None:
    result = _detect("--sysfs-root", str(sysfs_tree("kunpeng920")), "--arch", "aarch64", "--allowed-cpus", "all")
    assert result.returncode == 0, result.stderr
    assert "aarch64 (CPU instances take cores highest index first)" in result.stdout
    assert "4 online" not in result.stdout and "192 online, 192 usable" in result.stdout
    assert ["cpu", "cpu-3", "cpu", "torch", "1", "48", "3", "144-191", "(highest", "first)"] in [
        line.split() for line in result.stdout.splitlines()
    ]


def test_an_unknown_architecture_is_refused_not_planned_as_x86(sysfs_tree) -> None:
    result = _detect("--sysfs-root", str(sysfs_tree("kunpeng920")), "--arch", "arm64v8", "--allowed-cpus", "all")
    assert result.returncode == 2
    assert "--arch: invalid choice: 'arm64v8' (choose from" in result.stderr and not result.stdout
    upper = _detect("--sysfs-root", str(sysfs_tree("kunpeng920")), "--arch", "AArch64", "--allowed-cpus", "all")
    assert upper.returncode == 0 and "aarch64 (CPU instances take cores highest index first)" in upper.stdout


def test_sysfs_root_from_environment(sysfs_tree) -> None:
    result = _detect("--json", "--allowed-cpus", "all", env={"WINDVE_SYSFS_ROOT": str(sysfs_tree("gapped"))})
    assert result.returncode == 0, result.stderr
    nodes = json.loads(result.stdout)["hardware"]["cpu"]["nodes"]
    assert [(node["id"], node["memory_only"]) for node in nodes] == [(0, False), (2, False), (3, True)]


def test_explicit_plan_from_config_file(tmp_path, sysfs_tree) -> None:
    config = tmp_path / "windve.yaml"
    config.write_text(README_PLAN)
    result = _detect("--json", "--config", str(config), "--sysfs-root", str(sysfs_tree("vm2")), "--allowed-cpus", "0-1")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["plan"]
    assert plan["heterogeneous"] is True and plan["layout"] == "explicit"
    assert [(p["name"], [(i["device"], i["cores"], i["engine"]) for i in p["instances"]]) for p in plan["pools"]] == [
        ("accelerator", [("cpu", [0], "torch")]),
        ("cpu", [("cpu", [1], "onnx")]),
    ]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("plan:\n  - {pool: cpu, device: cpu, cores: [7]}\n", "plan[0] (cpu-0): cores 7 do not exist"),
        ("cpu_layout: per-socket\n", "invalid setting cpu_layout"),
    ],
)
def test_bad_config_exits_2_with_a_message(tmp_path, sysfs_tree, config, message) -> None:
    path = tmp_path / "windve.yaml"
    path.write_text(config)
    result = _detect("--config", str(path), "--sysfs-root", str(sysfs_tree("vm2")), "--allowed-cpus", "all")
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_malformed_tree_exits_2_naming_the_file(fresh_tree) -> None:
    root = fresh_tree("vm2")
    bad = root / "devices/system/node/node0/cpulist"
    bad.write_text("0-one\n")
    result = _detect("--sysfs-root", str(root))
    assert result.returncode == 2
    assert f"windve detect: {bad} is malformed" in result.stderr and "Traceback" not in result.stderr


def test_add_parser_registers_detect_with_its_options() -> None:
    parser = argparse.ArgumentParser(prog="windve")
    detect.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["detect", "--json", "--sysfs-root", "/x", "--config", "c.yaml"])
    assert (args.command, args.json, args.sysfs_root, args.config) == ("detect", True, Path("/x"), Path("c.yaml"))
    assert args.run is detect.run
