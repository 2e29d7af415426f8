"""Run `windve calibrate` in-process the way the `windve` entry point does."""

from __future__ import annotations

import argparse

from windve.commands import calibrate


def run_cli(*argv: str) -> int:
    """Parse and run `windve calibrate ARGV` (argparse errors raise SystemExit(2))."""
    parser = argparse.ArgumentParser(prog="windve")
    calibrate.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["calibrate", *argv])
    return args.run(args)
