"""Shared-memory segments owned by the parent, and process-shared POSIX semaphores inside them.

Segments are plain files in /dev/shm (not multiprocessing.shared_memory: its resource
tracker, shared with spawned children, unlinks or warns about segments it does not own).
The parent creates a segment, the ranks map it by path, and the parent unlinks the name as
soon as every rank has mapped it: from then on the memory lives exactly as long as some
process maps it, so no exit path (SIGKILL included) can leave it behind. Names carry the
creator's pid; `sweep_stale` removes segments whose creator died before unlinking them.

The semaphores are glibc/musl `sem_t`s initialised process-shared inside the segment.
POSIX lists sem_post/sem_wait/sem_trywait/sem_timedwait among the functions that
synchronize memory (XBD 4.12): every store the poster made before sem_post is visible to
a waiter after its successful wait, on any architecture (glibc implements them with
release/acquire atomics, which on ARM emit the barriers plain Python stores lack).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import secrets
import tempfile
import time
from pathlib import Path

SEGMENT_PREFIX = "windve-tp-"
# sizeof(sem_t) is 32 bytes on 64-bit glibc and 128 on 64-bit musl: each lives in its own
# 128-byte cell of the segment (layout.CELL).

_libc = ctypes.CDLL(None, use_errno=True)
_libc.sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
_libc.sem_destroy.argtypes = [ctypes.c_void_p]
_libc.sem_post.argtypes = [ctypes.c_void_p]
_libc.sem_trywait.argtypes = [ctypes.c_void_p]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc.sem_timedwait.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Timespec)]


def shm_dir() -> Path:
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(directory: Path | None = None) -> list[Path]:
    """Unlink segments whose creating process is gone; return what was removed."""
    removed = []
    for path in (directory or shm_dir()).glob(f"{SEGMENT_PREFIX}*"):
        pid_text = path.name[len(SEGMENT_PREFIX) :].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def segment_files(directory: Path | None = None) -> list[Path]:
    """Segments of this kind currently named in the shm directory (tests and diagnostics)."""
    return sorted((directory or shm_dir()).glob(f"{SEGMENT_PREFIX}*"))


class Segment:
    """One mapped shared-memory file. The creator unlinks; everyone closes."""

    def __init__(self, path: Path, size: int, mm: mmap.mmap) -> None:
        self.path = path
        self.size = size
        self.mm = mm
        # Taking the mapping's address pins a buffer export; it is released in close().
        self._anchor = ctypes.c_char.from_buffer(mm)
        self.address = ctypes.addressof(self._anchor)

    @classmethod
    def create(cls, size: int) -> Segment:
        sweep_stale()
        path = shm_dir() / f"{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # Sparse: no page is touched here, so each rank first-touches its own slots.
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return cls(path, size, mm)

    @classmethod
    def attach(cls, path: Path, size: int) -> Segment:
        fd = os.open(path, os.O_RDWR)
        try:
            return cls(Path(path), size, mmap.mmap(fd, size))
        finally:
            os.close(fd)

    def unlink(self) -> None:
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Unmap, if no view of the mapping is still alive (else the GC unmaps it later)."""
        self._anchor = None
        with contextlib.suppress(BufferError):
            self.mm.close()


class ProcessSemaphore:
    """A sem_t at a fixed address in a shared mapping."""

    def __init__(self, address: int) -> None:
        self._ptr = ctypes.c_void_p(address)

    def init(self, value: int = 0) -> None:
        if _libc.sem_init(self._ptr, 1, value) != 0:
            raise OSError(ctypes.get_errno(), "sem_init failed")

    def destroy(self) -> None:
        _libc.sem_destroy(self._ptr)

    def post(self) -> None:
        _libc.sem_post(self._ptr)

    def acquire(
        self, deadline: float | None, spin: int = 100, yield_seconds: float = 0.002, block_slice: float = 0.05
    ) -> bool:
        """Take one token by `deadline` (monotonic seconds; None = wait forever).

        Spin first (a peer rank usually posts within microseconds), then yield the core
        (ranks may share cores), then sleep in the kernel in short slices so a deadline is
        never overshot by more than one slice.
        """
        ptr, trywait = self._ptr, _libc.sem_trywait
        for _ in range(spin):
            if trywait(ptr) == 0:
                return True
        yield_until = time.monotonic() + yield_seconds
        while True:
            if trywait(ptr) == 0:
                return True
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            if now < yield_until:
                os.sched_yield()
                continue
            wake = now + block_slice if deadline is None else min(deadline, now + block_slice)
            absolute = time.time() + (wake - now)  # sem_timedwait takes CLOCK_REALTIME
            stamp = _Timespec(int(absolute), int((absolute % 1) * 1e9))
            if _libc.sem_timedwait(ptr, ctypes.byref(stamp)) == 0:
                return True
