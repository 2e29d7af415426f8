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
versions, still being set up, or on a file system that cannot lock) are left alone.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "windve-"
LOCK = "lock"
# flock's answers on a file system that has no locks (some NFS mounts, FUSE): the service runs
# without one, as it did before folders were locked, and a kill leaves its folder behind.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)


class Workdir:
    """A new folder under `root` (default: the temporary folder), locked while this object is open."""

    def __init__(self, root: str | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
        pending = self.path / f".{LOCK}.pending"
        self._fd: int | None = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError as error:
            os.close(self._fd)
            self._fd = None
            if error.errno not in _NO_LOCKS:
                shutil.rmtree(self.path, ignore_errors=True)
                raise
            os.unlink(pending)
            log.warning("%s cannot be locked (%s): if this service is killed outright, remove the folder "
                        "by hand", self.path, os.strerror(error.errno))
        else:
            os.rename(pending, self.path / LOCK)

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
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
