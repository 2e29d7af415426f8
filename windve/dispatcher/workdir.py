"""The folder a multi-process `windve serve` shares with its front ends, and those of dead services.

The folder (TMPDIR, else /tmp: `windve-XXXXXXXX`) holds the settings and spec files the front ends
read, the dispatcher's socket, the state board and the front ends' Prometheus files. A service that
stops removes it; one killed outright (SIGKILL, the OOM killer) cannot, and on a host whose service
manager restarts it such folders had piled up, one per kill. So each service holds an exclusive
flock on its folder's `lock` file for its life, and a starting service removes every `windve-*`
folder whose lock nobody holds: the kernel drops a lock when its holder dies, however it dies, so
no pid (which the system may have given to another process since) is read.

The lock file is locked under a temporary name and then renamed to `lock`, so that a folder with a
`lock` is always one whose owner has held it: a cleaner that found the file before its owner
locked it would remove a starting service's folder. Folders without a `lock` (made by older
versions, or still being set up) are left alone.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "windve-"
LOCK = "lock"


class Workdir:
    """A new folder under `root` (default: the temporary folder), locked while this object is open."""

    def __init__(self, root: str | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
        pending = self.path / f".{LOCK}.pending"
        self._fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        os.rename(pending, self.path / LOCK)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)  # after the removal: until then the folder is in use


def remove_stale_workdirs(root: str | None = None) -> list[Path]:
    """Remove the folders of services that died without removing theirs; the paths removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        if _owner_is_gone(folder / LOCK):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    if removed:
        log.info("removed %d folder(s) of windve services that were killed: %s",
                 len(removed), ", ".join(map(str, removed)))
    return removed


def _owner_is_gone(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:  # no lock file (not ours, an older version's, being set up), or another user's
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its service runs
        return False
    else:
        return True  # our lock is released when fd closes, after the caller decided
    finally:
        os.close(fd)
