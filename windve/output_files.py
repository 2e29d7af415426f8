"""Output paths checked before minutes of load or profiling, not after them."""

from __future__ import annotations

import tempfile
from pathlib import Path


def check_writable(path: Path, flag: str) -> None:
    """Raise ValueError naming `flag` unless `path` can be written: really open the file (or one
    beside it), since a folder that exists may still refuse it (/proc, a read-only mount)."""
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: folder {parent} does not exist")
    try:
        if path.exists():
            with path.open("a"):
                pass
        else:
            with tempfile.TemporaryFile(dir=parent):
                pass
    except OSError as error:
        raise ValueError(f"{flag} {path} is not writable ({error.strerror or error})") from None
