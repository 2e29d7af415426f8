"""`windve` command line: serve, detect, calibrate, loadtest."""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys

COMMANDS = ("serve", "detect", "calibrate", "loadtest")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="windve", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"windve.commands.{name}")
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per profiling request drowns the report
    command = "windve"
    try:
        args = build_parser().parse_args(argv)
        command = f"windve {args.command}"
        module = importlib.import_module(f"windve.commands.{args.command}")
        return int(module.run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C a command does not handle itself (its imports, a wait): no traceback
        print(f"{command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
