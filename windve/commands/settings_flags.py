"""CLI flags generated from the Settings fields, so every knob has a flag and one name."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from windve.settings import Settings, SettingsError, load_settings

# Lists of structured values only make sense in the config file.
FILE_ONLY = {"plan"}


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML/JSON settings file (env WINDVE_CONFIG)")
    for name, field in Settings.model_fields.items():
        if name in FILE_ONLY:
            continue
        flag = "--" + name.replace("_", "-")
        default = str(field.default) if isinstance(field.default, Path) else repr(field.default)
        help_text = f"env WINDVE_{name.upper()} (default: {default})"
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, metavar=name.upper(), help=help_text)


def settings_from_args(args: argparse.Namespace, prog: str) -> Settings:
    """Settings from flags > env > config file > defaults; exit 2 naming the bad setting."""
    overrides: dict[str, Any] = {
        name: _flag_value(getattr(args, name))
        for name in Settings.model_fields
        if getattr(args, name, None) is not None
    }
    try:
        return load_settings(config_file=getattr(args, "config", None), **overrides)
    except SettingsError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def _flag_value(value: Any) -> Any:
    """A list-valued flag may be written as JSON (`--matryoshka-dims '[128,256]'`), as its env variable may."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value  # validation names the setting and what was wrong
    return value
