"""Start one worker rank as a fresh interpreter and keep the parent's handles on it.

A socketpair carries the plan and then the messages; the parent's end reports EOF the
moment the child dies (the child holds the only other end). A pidfd, where the kernel
has them, additionally becomes readable on exit, so death is seen even by a wait that
is not reading that rank's socket.

The child also asks the kernel to SIGKILL it when this process dies (windve/parent_death.py): an
engine stopped at that moment never reads its socket's EOF. The signal follows the thread that
started the child, so ranks are started from the instance's executor thread, which lives as long
as the instance.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection

from windve.engine_process.worker import THREAD_VARIABLES, RankPlan


class RankProcess:
    def __init__(self, plan: RankPlan) -> None:
        parent_sock, child_sock = socket.socketpair()
        env = dict(os.environ)
        if plan.cores or plan.threads:  # as the child will set them, before anything reads them
            env.update({variable: str(plan.threads or len(plan.cores)) for variable in THREAD_VARIABLES})
        inherited = (child_sock.fileno(),) + (() if plan.heartbeat_fd is None else (plan.heartbeat_fd,))
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "windve.engine_process.worker", str(child_sock.fileno()), str(os.getpid())],
                pass_fds=inherited,
                env=env,
            )
        finally:
            child_sock.close()
        self.pid = self.popen.pid
        self.rank = plan.rank
        self.conn = Connection(parent_sock.detach())
        self.pidfd = self._open_pidfd()
        self.conn.send_bytes(plan.to_json())

    def _open_pidfd(self) -> int | None:
        try:
            return os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # kernel < 5.3 or not Linux: socket EOF suffices
            return None

    def handles(self) -> list:
        """What multiprocessing.connection.wait should watch for this rank."""
        return [self.conn] if self.pidfd is None else [self.conn, self.pidfd]

    def describe_exit(self, wait_seconds: float = 1.0) -> str:
        try:
            code = self.popen.wait(timeout=wait_seconds)
        except subprocess.TimeoutExpired:
            return "closed its pipe"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in D state: nothing more to do
            self.popen.wait(timeout=5.0)

    def close(self) -> None:
        self.conn.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
