"""A real redis-server on a free loopback port, as a pytest fixture.

Use it from any test module or conftest:

    from tests.redis_server import redis_server  # noqa: F401  (pytest fixture)

    def test_x(redis_server):
        client = redis.Redis.from_url(redis_server.url)

Each test gets its own server (it starts in milliseconds): tests may kill, pause or restart
it freely. Nothing is persisted (`--save '' --appendonly no`), so a restart empties it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

READY_TIMEOUT_SECONDS = 15.0
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers_ping(port: int, timeout: float = 0.5) -> bool:
    """Plain-socket PING, so the fixture does not depend on the client under test. Any reply
    counts: a server with a password answers -NOAUTH, which still means it is up."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"PING\r\n")
            return sock.recv(64)[:1] in (b"+", b"-")
    except OSError:
        return False


class RedisServer:
    """One redis-server process; start() after stop()/kill() reuses the same port.
    `extra_args` are more redis-server options, e.g. ["--requirepass", "secret"]."""

    def __init__(self, workdir: Path, port: int | None = None, extra_args: Sequence[str] = ()) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.host = "127.0.0.1"
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "redis-server.log"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.running:
            return
        command = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self.workdir),
            "--logfile", str(self.log_path),
            *self.extra_args,
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        # Ready when this process says so in its log, not when the port answers: another test
        # process (pytest -n) may have a server on a port this one failed to bind.
        while not (self._says_ready() and answers_ping(self.port)):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {self.process.returncode} on port {self.port}:\n{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not answer PING within {READY_TIMEOUT_SECONDS} s")
            time.sleep(0.005)  # poll interval of the readiness loop, bounded by the deadline above

    def _says_ready(self) -> bool:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return False
        # Only this start's lines: a restart appends to the log of the one before.
        mine = [line for line in lines if line.startswith(f"{self.process.pid}:")]
        return any("eady to accept connections" in line for line in mine)  # "Ready to ..." or "... ready to ..."

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM)."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """Abrupt death (SIGKILL), as in a crashed or evicted pod."""
        self._end(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers, as a hung or overloaded server."""
        if self.running:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.running:
            os.kill(self.process.pid, signal.SIGCONT)

    def _end(self, sig: signal.Signals) -> None:
        if not self.running:
            return
        self.process.send_signal(sig)
        if sig != signal.SIGKILL:
            os.kill(self.process.pid, signal.SIGCONT)  # a paused server must run to handle SIGTERM
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-20:])
        except OSError:
            return "(no log)"


def require_redis_server() -> None:
    """Skip the calling test, with the fix in the message, when redis-server is not installed."""
    if not os.access(REDIS_SERVER, os.X_OK):
        pytest.skip(
            "redis-server is not installed; the README's test command installs it "
            "(apt-get install -y redis-server)"
        )


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    require_redis_server()
    server = start_on_free_port(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def start_on_free_port(workdir: Path, extra_args: Sequence[str] = (), attempts: int = 3) -> RedisServer:
    """Another process may grab the free port between our probe and redis-server's bind: try again."""
    for _ in range(attempts - 1):
        server = RedisServer(workdir, extra_args=extra_args)
        try:
            server.start()
            return server
        except RuntimeError:
            continue
    server = RedisServer(workdir, extra_args=extra_args)
    server.start()
    return server
