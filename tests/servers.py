"""Start and stop real `windve serve` processes on a free 127.0.0.1 port."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
import yaml

START_TIMEOUT = 180.0
PORT_TRIES = 3
PORT_IN_USE = 3  # `windve serve`'s exit status when it cannot listen


def engine_pids(url: str, pool: str | None = None) -> list[int]:
    """The engine processes of the pool named (of every pool without one), as /info lists them."""
    pools = httpx.get(url + "/info", timeout=30).json()["pools"]
    named = [entry for entry in pools if pool is None or entry["name"] == pool]
    assert named, f"no pool {pool}"
    return [pid for entry in named for instance in entry["instances"] for pid in instance["pids"]]


def wait_for(condition, what: str = "the condition", seconds: float = 120.0) -> None:
    """Return once `condition()` holds; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds:g} s: {what}"
        time.sleep(0.05)  # polling a real condition (no event to wait on), bounded by the deadline


def sums_by_label(metrics_text: str, sample: str, label: str) -> dict[str, float]:
    """The values of /metrics sample `sample` (a counter's `..._total`, a histogram's `..._count`),
    added up per value of `label` over the other labels."""
    sums: dict[str, float] = {}
    for labels, value in _samples(metrics_text, sample):
        sums[labels[label]] = sums.get(labels[label], 0.0) + value
    return sums


def metric_sum(metrics_text: str, sample: str, **labels: str) -> float:
    """The values of /metrics sample `sample` whose labels include `labels`, added up (0 if none)."""
    return sum(value for found, value in _samples(metrics_text, sample) if labels.items() <= found.items())


def _samples(metrics_text: str, sample: str) -> list[tuple[dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (found.labels, found.value)
        for family in text_string_to_metric_families(metrics_text)
        for found in family.samples
        if found.name == sample
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServerProcess:
    url: str
    port: int
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server(
    workdir: Path, *args: str, env: dict[str, str] | None = None, wait: bool = True,
    open_files: tuple[int, int] | None = None,
) -> ServerProcess:
    """`windve serve` with `args`; waits until /health answers 200 (or the process dies).
    `open_files`: the (soft, hard) descriptor limit it starts with."""
    for attempt in range(PORT_TRIES):
        server = _launch(workdir, args, env, open_files)
        if not wait:
            return server
        try:
            wait_healthy(server)
            return server
        except RuntimeError:
            # Exit 3: the port, free when chosen, was taken before the server bound it (another
            # test process under pytest -n, or a client's outgoing connection).
            if server.process.returncode != PORT_IN_USE or attempt == PORT_TRIES - 1:
                raise
    raise AssertionError("unreachable")


def _launch(workdir: Path, args: tuple[str, ...], env: dict[str, str] | None,
            open_files: tuple[int, int] | None) -> ServerProcess:
    port = free_port()
    log_path = workdir / f"server-{port}.log"
    full_env = os.environ | {"HF_HUB_OFFLINE": "1", "WINDVE_ONNX_CACHE_DIR": str(workdir / "onnx")} | (env or {})
    command = [sys.executable, "-m", "windve.commands.serve", "--host", "127.0.0.1", "--port", str(port), *args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=workdir,
                                   preexec_fn=None if open_files is None else _limit_open_files(open_files))
    return ServerProcess(f"http://127.0.0.1:{port}", port, process, log_path)


def _limit_open_files(limits: tuple[int, int]) -> Callable[[], None]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)

    return limit


def wait_healthy(server, timeout: float = START_TIMEOUT) -> None:
    """Poll GET /health until 200. `server` has .url and .process; .log() adds its output to errors."""
    describe = getattr(server, "log", lambda: "")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{describe()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)  # polling interval of a real condition, bounded by the deadline
    server.process.kill()
    server.process.wait()
    raise TimeoutError(f"server not healthy after {timeout}s:\n{describe()}")


def long_text(i: int) -> str:
    """A distinct text of about 250 tokens: long enough that batches take measurable time."""
    return f"Request number {i} asks about " + " ".join(
        f"topic{i}-{j} of the retrieval pipeline and its embedding service" for j in range(24)
    )


def write_plan_config(folder: Path, plan: list[dict], **settings) -> str:
    """A config file with an explicit instance plan (any pool on any core set) and settings."""
    path = folder / "windve.yaml"
    path.write_text(yaml.safe_dump({"cpu_layout": "explicit", "plan": plan, **settings}))
    return str(path)


@contextlib.contextmanager
def uvicorn_in_thread(app, **config) -> Iterator[tuple[uvicorn.Server, int]]:
    """`app` served by a real uvicorn on 127.0.0.1 in a thread of this process: (server, port)."""
    for _ in range(PORT_TRIES):  # a port taken before uvicorn bound it ends its thread: try another
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                               lifespan="off", **config))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            threading.Event().wait(0.01)  # uvicorn offers no start event to wait on
        if server.started or thread.is_alive():
            break
    assert server.started, "uvicorn did not start"
    try:
        yield server, port
    finally:
        server.should_exit = True
        thread.join(10)


async def asgi_body(receive) -> bytes:
    """An ASGI request's whole body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def read_answers(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """`count` HTTP/1.1 responses off a raw socket, each (status, headers, body); fewer if it closes first."""
    data, answers = b"", []
    while len(answers) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            lines = data[:head_end].decode("latin-1").split("\r\n")
            headers = dict(line.lower().split(": ", 1) for line in lines[1:])
            end = head_end + 4 + int(headers["content-length"])
            if len(data) >= end:
                answers.append((int(lines[0].split()[1]), headers, data[head_end + 4 : end]))
                data = data[end:]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return answers
