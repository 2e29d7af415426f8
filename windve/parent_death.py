"""A child process that ends when the process that started it dies, however it dies.

A pipe's EOF or a polled pid ends a child only once it looks; one stopped (SIGSTOP, a debugger, a
frozen cgroup) or stuck in a device call then would live on as an orphan, holding a port, cores or
device memory. Linux delivers a chosen signal at the parent's death (`PR_SET_PDEATHSIG`), whatever
state the child is in. The kernel ties it to the parent's *thread* that forked the child: parents
start these children from threads that live as long as the child should.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h

log = logging.getLogger(__name__)


def signal_at_parent_death(parent: int, sig: signal.Signals) -> bool:
    """Ask for `sig` when `parent` dies; False if it has died already (no signal would come)."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            # A seccomp profile may forbid it. The children's own checks of their parent (a
            # pipe's end, a polled pid) still end them, once they look.
            log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
    return os.getppid() == parent
