"""Cost of the dispatch decision and its bookkeeping, per query, with two pools under contention.

Many closed-loop clients keep both pools near full (so Algorithm 1 keeps overflowing to the
CPU pool and answering BUSY), while instant instances finish batches on the next loop
tick. Timed: `QueueManager.admit` (Algorithm 1 + slot bookkeeping + enqueue) per query, and
the completion bookkeeping (`_complete`: free the slot, deliver the row) per query.
Both are measured as this thread's CPU time (what the decision costs, immune to the OS
preempting the process on a shared machine) and as wall time (what a request waits).

    python bench/dispatch.py [--clients 256] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from queue_manager.manager import QueueManager
from queue_manager.protocol import Busy
from windve.gc_tuning import tune_gc_for_serving

DIM = 384


class InstantInstance:
    def __init__(self, name: str) -> None:
        self.name = name
        self._vectors = np.zeros((256, DIM), dtype=np.float32)

    async def start(self) -> None: ...

    async def embed(self, sequences):
        await asyncio.sleep(0)  # finish on the next loop tick, as a real result callback would
        return self._vectors[: len(sequences)]

    async def restart(self) -> None: ...

    async def close(self) -> None: ...


class TimedQueueManager(QueueManager):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.samples: dict[str, list[float]] = {"admit": [], "complete": [], "admit_wall": [], "complete_wall": []}

    def _record(self, name: str, cpu_started: int, wall_started: int, queries: int) -> None:
        self.samples[name].append((time.thread_time_ns() - cpu_started) / queries)
        self.samples[name + "_wall"].append((time.perf_counter_ns() - wall_started) / queries)

    def admit(self, sequences, pool=None):
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        try:
            return super().admit(sequences, pool)
        finally:
            self._record("admit", cpu, wall, len(sequences))

    def _complete(self, batch, vectors) -> None:
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        super()._complete(batch, vectors)
        self._record("complete", cpu, wall, max(1, len(batch)))


async def run(clients: int, seconds: float) -> dict:
    qm = TimedQueueManager(
        [
            ("accelerator", 64, [InstantInstance("acc0"), InstantInstance("acc1")]),
            ("cpu", 96, [InstantInstance(f"cpu{i}") for i in range(4)]),
        ],
        heterogeneous=True,
        max_batch_size=32,
        batch_limits={"accelerator": (1024, 16384)},  # the service's defaults: a token budget on the accelerator
    )
    await qm.start()
    tune_gc_for_serving()  # as `windve serve` does once it is ready
    query = np.arange(75, dtype=np.int32)
    counts = {"ok": 0, "busy": 0}
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            try:
                await qm.submit([query])
                counts["ok"] += 1
            except Busy:
                counts["busy"] += 1
                await asyncio.sleep(0)

    await asyncio.gather(*(client() for _ in range(clients)))
    await qm.close()
    result: dict = {"queries_admitted": counts["ok"], "busy_answers": counts["busy"]}
    for name, values in qm.samples.items():
        micros = np.array(values) / 1000
        result[f"{name}_us_p50"] = float(np.percentile(micros, 50))
        result[f"{name}_us_p99"] = float(np.percentile(micros, 99))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    result = asyncio.run(run(args.clients, args.seconds))
    print(f"clients={args.clients} seconds={args.seconds}")
    for key, value in result.items():
        print(f"{key:28s} {value:10.2f}" if isinstance(value, float) else f"{key:28s} {value:10d}")
    for clock in ("", "_wall"):
        p99 = result[f"admit{clock}_us_p99"] + result[f"complete{clock}_us_p99"]
        verdict = "meets" if p99 <= 20 else "misses"
        label = "CPU time" if not clock else "wall time"
        print(f"admit+complete p99 per query ({label}): {p99:.2f} us ({verdict} the 20 us target)")


if __name__ == "__main__":
    main()
