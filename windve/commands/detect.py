"""`windve detect`: print the detected hardware and the instance plan the settings give."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from devices import DeviceError, PlanError, detect_hardware, render_json, render_text
from devices.cpulist import parse_cpulist
from windve.service import make_plan
from windve.settings import SettingsError, load_settings


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "detect",
        help="show the detected accelerators, CPU/NUMA topology and instance plan",
        description="Detect accelerators and the CPU/NUMA topology, and print the instance plan "
        "that `windve serve` would use with the same settings.",
    )
    _add_arguments(parser)
    parser.set_defaults(run=run)


ARCHITECTURES = ("x86_64", "aarch64")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--config", type=Path, help="YAML/JSON config file (same as WINDVE_CONFIG)")
    parser.add_argument("--sysfs-root", type=Path, help="sysfs tree to read (default /sys; WINDVE_SYSFS_ROOT)")
    parser.add_argument(
        "--arch",
        type=str.lower,
        choices=ARCHITECTURES,  # the planner only tells ARM (core grouping) from the rest; a typo would plan x86
        help="architecture to plan for (default: this machine's); for previewing another machine's tree",
    )
    parser.add_argument(
        "--allowed-cpus",
        help="CPU list the plan may use, e.g. 0-15, or 'all' for every online CPU of the tree "
        "(default: this process's CPU affinity)",
    )


def run(args: argparse.Namespace) -> int:
    """Print hardware and plan; 0 on success, 2 with a one-line reason on bad settings or hardware."""
    try:
        settings = load_settings(config_file=args.config, sysfs_root=args.sysfs_root)
        hardware = detect_hardware(settings.sysfs_root, allowed_cpus=_allowed(args), arch=args.arch)
        plan = make_plan(settings, hardware)  # the same call `windve serve` makes
    except (SettingsError, DeviceError, PlanError) as exc:
        print(f"windve detect: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render_json(hardware, plan) + "\n" if args.json else render_text(hardware, plan))
    return 0


def _allowed(args: argparse.Namespace) -> set[int] | str | None:
    text = getattr(args, "allowed_cpus", None)
    if text is None:
        return None  # this process's CPU affinity
    if text.strip() == "all":
        return "all"
    try:
        return parse_cpulist(text)
    except ValueError as exc:
        raise SettingsError(f"--allowed-cpus: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="windve detect")
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
