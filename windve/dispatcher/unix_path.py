"""A Unix socket's path that fits its address, however deep the folder it lies in.

A Unix socket's address holds at most 107 bytes of path (sun_path is 108 with its NUL). The
dispatcher's socket lies in the service's work folder under TMPDIR, and a deep TMPDIR (a CI
runner's, a pytest's, a container's mount) put it past that: `windve serve` with several front
ends stopped at start with "AF_UNIX path too long". Such a path is reached through a descriptor
of its folder instead (/proc/self/fd/N/name, Linux), which bind and connect resolve like any
path: the socket is the same file in the same folder.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

MAX_PATH_BYTES = 107  # sun_path's 108 bytes less the NUL


@contextlib.contextmanager
def reachable(path: str) -> Iterator[str]:
    """`path` as a Unix socket's address: itself where it fits, else through its folder's
    descriptor, open while the context lasts (bind or connect within it)."""
    if len(os.fsencode(path)) <= MAX_PATH_BYTES:
        yield path
        return
    folder, name = os.path.split(path)
    descriptor = os.open(folder or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{descriptor}/{name}"
    finally:
        os.close(descriptor)
