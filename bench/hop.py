"""What the front end -> dispatcher hop costs per request: in-process against a Unix socket between processes.

The same queue manager serves both, over an instance that answers at once (zeros), so what is
timed is the path around the model: admission, batching, the hop and the answer. Prints the
round trip of one request at a time (latency) and the requests per second with 64 in flight
(throughput), for the in-process `LocalDispatcher` and for a `RemoteDispatcher` talking to a
`DispatcherServer` in a child process over its Unix socket, and the CPU time per request of each
side of the hop in the throughput run (from /proc: every thread), which is what bounds one
dispatcher process: at X us per request it admits at most 1 / X requests a second.

    python bench/hop.py [--requests 5000] [--texts 1]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from queue_manager.manager import QueueManager  # noqa: E402
from windve.dispatcher.board import StateBoard  # noqa: E402
from windve.dispatcher.client import LocalDispatcher, RemoteDispatcher  # noqa: E402
from windve.engine_process.usage import process_usage  # noqa: E402

DIM = 384


class Echo:
    name = "echo"

    async def start(self) -> None:
        pass

    async def embed(self, sequences):
        return np.zeros((len(sequences), DIM), dtype=np.float32)

    async def restart(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def _runtime() -> SimpleNamespace:
    qm = QueueManager([("cpu", 10**6, [Echo()])], max_batch_size=64)
    await qm.start()
    return SimpleNamespace(accepting=True, ready=True, queue_manager=qm, info=dict)


def _serve(address: str, board: str, ready) -> None:
    from windve.dispatcher.server import DispatcherServer

    async def main() -> None:
        runtime = await _runtime()
        server = DispatcherServer(address, StateBoard(Path(board)), lambda: runtime)
        server.start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def _cpu_seconds(pid: int) -> float:
    usage = process_usage(pid)
    return usage[1] if usage is not None else float("nan")


async def _measure(dispatcher, requests: int, texts: int, server_pid: int | None = None) -> tuple[float, ...]:
    sequences = [np.arange(1, 76, dtype=np.int32)] * texts

    async def one() -> None:
        ticket = dispatcher.submit(sequences)
        await ticket.future
        ticket.result()

    for _ in range(200):  # warm-up
        await one()
    started = time.perf_counter()
    for _ in range(requests):
        await one()
    latency = (time.perf_counter() - started) / requests

    async def worker(count: int) -> None:
        for _ in range(count):
            await one()

    own = server = None
    if server_pid is not None:
        own, server = _cpu_seconds(os.getpid()), _cpu_seconds(server_pid)
    started = time.perf_counter()
    await asyncio.gather(*(worker(requests // 64) for _ in range(64)))
    done = (requests // 64) * 64
    throughput = done / (time.perf_counter() - started)
    if server_pid is None:
        return latency, throughput
    own_us = (_cpu_seconds(os.getpid()) - own) / done * 1e6
    server_us = (_cpu_seconds(server_pid) - server) / done * 1e6
    return latency, throughput, own_us, server_us


async def _local(requests: int, texts: int) -> tuple[float, float]:
    runtime = await _runtime()
    return await _measure(LocalDispatcher(runtime), requests, texts)


async def _remote(address: str, board: Path, requests: int, texts: int, server_pid: int) -> tuple[float, ...]:
    client = RemoteDispatcher(address, board)
    client.start()
    try:
        return await _measure(client, requests, texts, server_pid)
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--texts", type=int, default=1, help="texts (75 tokens each) per request")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="windve-hop-"))
    board = folder / "board"
    StateBoard(board, create=True).close()
    address = str(folder / "dispatcher.sock")
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    child = context.Process(target=_serve, args=(address, str(board), ready), daemon=True)
    child.start()
    ready.wait(60)
    try:
        local = asyncio.run(_local(args.requests, args.texts))
        remote = asyncio.run(_remote(address, board, args.requests, args.texts, child.pid))
    finally:
        child.kill()
    print(f"{args.requests} requests of {args.texts} x 75-token text(s), an instance that answers at once")
    print(f"{'path':<34} {'one at a time (us)':>19} {'64 in flight (req/s)':>21}")
    print(f"{'in process (LocalDispatcher)':<34} {local[0] * 1e6:>19.1f} {local[1]:>21.0f}")
    print(f"{'Unix socket (RemoteDispatcher)':<34} {remote[0] * 1e6:>19.1f} {remote[1]:>21.0f}")
    print(f"the hop adds {(remote[0] - local[0]) * 1e6:.1f} us to a request's round trip")
    print(f"CPU per request at 64 in flight: front-end side {remote[2]:.1f} us, dispatcher {remote[3]:.1f} us")


if __name__ == "__main__":
    main()
