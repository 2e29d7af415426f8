"""The shared folder of a multi-process `windve serve`: a service killed outright leaves its folder,
and the next service to start removes it, never a running service's folder nor one it cannot tell."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from windve.dispatcher import workdir
from windve.dispatcher.workdir import LOCK, PREFIX, Workdir, remove_stale_workdirs

# A service's stand-in: a process that opens a Workdir, says where, and waits to be told to stop
# (a line on its stdin) or to be killed.
HOLDER = """
import sys
from windve.dispatcher.workdir import Workdir
folder = Workdir(sys.argv[1])
print(folder.path, flush=True)
sys.stdin.readline()
"""


def start_holder(root: Path) -> tuple[subprocess.Popen, Path]:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    return process, Path(process.stdout.readline().strip())


def test_a_killed_services_folder_is_removed_and_a_running_ones_kept(tmp_path):
    killed, killed_folder = start_holder(tmp_path)
    running, running_folder = start_holder(tmp_path)
    try:
        (killed_folder / "settings.json").write_text("{}")
        killed.kill()
        killed.wait()
        assert killed_folder.is_dir()  # SIGKILL: nothing ran to remove it

        assert remove_stale_workdirs(str(tmp_path)) == [killed_folder]

        assert not killed_folder.exists()
        assert (running_folder / LOCK).is_file()
    finally:
        running.communicate("\n", timeout=30)
    # Its holder gone, the running service's folder is stale too.
    assert remove_stale_workdirs(str(tmp_path)) == [running_folder]


def test_folders_it_cannot_tell_are_left_alone(tmp_path):
    older = tmp_path / f"{PREFIX}older"  # an older version's: no lock file
    older.mkdir()
    starting = tmp_path / f"{PREFIX}starting"  # the lock not yet renamed into place
    starting.mkdir()
    (starting / f".{LOCK}.pending").touch()
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / LOCK).touch()

    assert remove_stale_workdirs(str(tmp_path)) == []
    assert older.is_dir() and starting.is_dir() and other.is_dir()


def test_a_stopping_service_removes_its_own_folder(tmp_path):
    folder = Workdir(str(tmp_path))
    assert folder.path.parent == tmp_path and folder.path.name.startswith(PREFIX)
    assert remove_stale_workdirs(str(tmp_path)) == []  # held by this process
    folder.remove()
    assert list(tmp_path.iterdir()) == []


def refuse_locks(monkeypatch, code: int) -> None:
    def flock(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(workdir.fcntl, "flock", flock)


def test_on_a_file_system_without_locks_a_service_runs_unlocked_and_its_folder_is_kept(tmp_path, monkeypatch):
    refuse_locks(monkeypatch, errno.ENOLCK)  # as an NFS mount without a lock manager answers
    folder = Workdir(str(tmp_path))
    assert not folder.locked
    assert list(folder.path.iterdir()) == []  # no lock file: no later start can take it for a dead one's
    assert remove_stale_workdirs(str(tmp_path)) == []
    folder.remove()
    assert not folder.path.exists()


def test_any_other_lock_failure_fails_the_start_and_leaves_no_folder(tmp_path, monkeypatch):
    refuse_locks(monkeypatch, errno.EIO)
    with pytest.raises(OSError, match="Input/output error"):
        Workdir(str(tmp_path))
    assert list(tmp_path.iterdir()) == []
