"""The C allocator's settings for a serving process: large buffers go back to the system when freed.

glibc serves an allocation over its mmap threshold (128 KiB at start) from a mapping of its own,
returned on free, but raises the threshold to the size of each such block freed, up to 32 MiB.
After the first large answer, answers of up to that size come from the heap, where a freed one
can be reused but seldom returned. Where large answers outlive the requests around them (clients
that time out or stop reading while theirs is written), the front end grew by the answers' size
with every wave and never came back: 30 clients that reset their connections before reading a
9.6 MB answer, five times over, took it from 653 to 1,319 MiB; with the threshold held at 1 MiB
it stayed at 421-427 MiB (bench/SERVED.md). Answers below it, as nearly all are, stay on the heap.

The price is paid by large answers: each one's pages are faulted in afresh, ~0.4 ms a MB (a
15 MB answer encoded in 41 ms instead of 34). Calling malloc_trim every 10 s kept the front end
as flat at no cost per answer, but each call held the allocator for up to 31 ms, a stall of
every thread that allocates; a bounded cost on the requests that carry it was preferred.
"""

from __future__ import annotations

import ctypes
import platform

M_MMAP_THRESHOLD = -3  # <malloc.h>
LARGE_BUFFER = 1 << 20  # bytes from which an allocation is mapped on its own, and unmapped when freed


def return_large_buffers() -> bool:
    """Hold glibc's mmap threshold at LARGE_BUFFER (which also stops it from moving); whether it
    was set (False where the C library is not glibc)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, LARGE_BUFFER))
