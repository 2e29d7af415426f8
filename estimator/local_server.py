"""A server run as a subprocess for as long as it is profiled.

`local_server` starts a command on a free 127.0.0.1 port, waits until GET /health answers 200 from
it, yields its base URL, and stops it with SIGTERM (SIGKILL if it does not exit within `stop_timeout`).
What the server prints goes to a temporary file, shown in the error when it exits before it is ready.

A free port is one nothing listened on a moment ago: another process can take it before the server
binds it, and then answer /health itself. The 200 counts only where the server started (or a child of
it) listens on the port (psutil); otherwise it starts again on another port, rather than profile
another server as its own.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import IO

import httpx
import psutil

START_TIMEOUT = 300.0  # loading a large model, or compiling for an accelerator, takes minutes
POLL_SECONDS = 0.1
PORT_ATTEMPTS = 3  # ports tried when another process takes the free one first


class ServerStartError(RuntimeError):
    """The server exited, or did not answer /health in time; the message ends with its output."""


class PortTaken(ServerStartError):
    """Another process listens on the port chosen for the server, and answers /health."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _output(log: IO[bytes], limit: int = 4000) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-limit:]


def _answers(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` or one of its descendants listens on TCP `port`."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for member in family:
        try:
            sockets = member.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(sock.status == psutil.CONN_LISTEN and sock.laddr.port == port for sock in sockets):
            return True
    return False


async def _wait_healthy(url: str, port: int, process: subprocess.Popen, log: IO[bytes], timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with httpx.AsyncClient(timeout=2.0) as client:
        while loop.time() < deadline:
            if process.poll() is not None:
                if _answers(port):  # it could not bind: another process had taken the port first
                    raise PortTaken(f"another process listens on port {port}; the server started there exited")
                raise ServerStartError(
                    f"the server exited with {process.returncode} before it was ready:\n{_output(log)}"
                )
            try:
                if (await client.get(url + "/health")).status_code == 200:
                    if _listens(process.pid, port):
                        return
                    raise PortTaken(f"another process answers on port {port}, not the server started there")
            except httpx.HTTPError:
                pass  # not listening yet
            await asyncio.sleep(POLL_SECONDS)  # the interval of polling a real condition, bounded by the deadline
    raise ServerStartError(f"the server did not answer {url}/health within {timeout:g} s:\n{_output(log)}")


def _stop(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds; blocking until the server has exited."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def _stopped(process: subprocess.Popen, timeout: float) -> None:
    try:
        await asyncio.to_thread(_stop, process, timeout)
    except asyncio.CancelledError:  # cancelled again while stopping (SIGTERM's re-cancel): finish here
        _stop(process, timeout)
        raise


@asynccontextmanager
async def local_server(
    command: Callable[[int], Sequence[str]],
    env: Mapping[str, str],
    *,
    start_timeout: float = START_TIMEOUT,
    stop_timeout: float = 60.0,
) -> AsyncIterator[str]:
    """Run `command(port)` with `env` until the block ends; yields "http://127.0.0.1:PORT" once healthy."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryFile() as log:
            process = subprocess.Popen(list(command(port)), env=dict(env), stdout=log, stderr=subprocess.STDOUT)
            try:
                try:
                    await _wait_healthy(url, port, process, log, start_timeout)
                except PortTaken:
                    if attempt < PORT_ATTEMPTS:
                        continue  # on another port, once this server is stopped
                    raise
                yield url
                return
            finally:
                await _stopped(process, stop_timeout)
