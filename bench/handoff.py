"""How much of the time an engine process computes when the event loop that feeds it is busy.

On a GPU host the dispatcher's loop reads, admits and answers thousands of requests a second, and
an engine's batch of a few milliseconds is handed over and answered through that loop and the
instance's threads. Every millisecond the hand-over waits, the device idles. This bench runs the
real queue manager and a real engine process (pinned to its own core; the loop to another), keeps
the loop busy in steps of a given length (what one burst of front-end messages costs it), and
prints, per step length, interpreter switch interval and batches held by the engine process
(`--pipelines`, the instance's `pipeline`: 2 by default), the engine's busy share: the sum of its
own compute time (windve_engine_compute_seconds) over the wall time. Every configuration runs in
the same process against the same engine, in alternating rounds, so the shares compare within one
run whatever the machine's speed.

The engine is a CPU engine, `--model` (default: make_encoder.py's one-layer MiniLM shape, written
to a temporary folder) at batches of `--batch` 75-token queries, small enough that a batch takes a
few milliseconds as on a GPU. What a GPU forward would add (launch overhead in the engine process)
is not modelled: this measures the loop's side of the hand-over only.

    python bench/handoff.py [--steps-ms 0,1,3,10] [--switch-ms 5,0.5] [--pipelines 2] [--rounds 2] [--seconds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from queue_manager.manager import QueueManager  # noqa: E402
from queue_manager.metrics import INFERENCE_TIME  # noqa: E402
from windve.engine_process.instance import ENGINE_COMPUTE, EngineProcessInstance  # noqa: E402
from windve.model import load_model_spec  # noqa: E402

POOL, INSTANCE = "accelerator", "accelerator-0"
CLIENTS = 256  # closed loop: always more queued than a batch holds
QUERY = np.arange(1000, 1075, dtype=np.int32)  # 75 valid token ids


def hold_the_loop(seconds: float) -> None:
    """Keep the interpreter lock for `seconds`, as the loop's Python work does."""
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        pass


def totals(done: int) -> tuple[int, float, float, float]:
    """(answered queries, batches, engine compute seconds, wall clock) now."""
    batches = sum(sample.value for sample in INFERENCE_TIME.collect()[0].samples
                  if sample.name.endswith("_count") and sample.labels["pool"] == POOL)
    compute = sum(sample.value for sample in ENGINE_COMPUTE.collect()[0].samples
                  if sample.name.endswith("_sum") and sample.labels["engine"] == INSTANCE)
    return done, batches, compute, time.perf_counter()


async def measure(args: argparse.Namespace, model: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("handoff.py needs two CPUs: one for the loop, one for the engine process")
    loop_core, engine_core = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, {loop_core})
    instance = EngineProcessInstance(
        load_model_spec(str(model)),
        name=INSTANCE,
        pool=POOL,
        rank_cores=[[engine_core]],
        numa_nodes=[0],
        dtype=args.dtype,
    )
    instance.ahead_fill = 0.0  # hand the next batch over at once, as an accelerator instance does
    manager = QueueManager([(POOL, 10**6, [instance])], max_batch_size=args.batch)
    await manager.start()
    state = {"done": 0, "step": 0.0, "stop": False}

    async def client() -> None:
        while not state["stop"]:
            await manager.admit([QUERY]).future
            state["done"] += 1

    async def busy() -> None:
        while not state["stop"]:
            if state["step"]:
                hold_the_loop(state["step"])
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(client()) for _ in range(CLIENTS)] + [asyncio.create_task(busy())]
    default_switch = sys.getswitchinterval()
    results: dict[tuple[float, float, int], list[tuple[float, float, float]]] = {}
    configurations = [
        (step_ms, switch_ms, pipeline)
        for step_ms in args.steps_ms
        for switch_ms in args.switch_ms
        for pipeline in args.pipelines
    ]
    try:
        for _ in range(args.rounds):
            for step_ms, switch_ms, pipeline in configurations:
                state["step"] = step_ms / 1000
                sys.setswitchinterval(switch_ms / 1000)
                instance.pipeline = pipeline
                await asyncio.sleep(args.settle)
                before = totals(state["done"])
                await asyncio.sleep(args.seconds)
                after = totals(state["done"])
                done, batches, compute, wall = (b - a for a, b in zip(before, after))
                results.setdefault((step_ms, switch_ms, pipeline), []).append(
                    (compute / wall, done / wall, 1000 * wall / max(batches, 1))
                )
    finally:
        sys.setswitchinterval(default_switch)
        state["stop"] = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await manager.close()
    print(f"\n== hand-over: engine busy share with the loop busy ({args.rounds} rounds of {args.seconds:g} s each, "
          f"batches of {args.batch}, {CLIENTS} clients)")
    print(" loop step  switch  batches held  engine busy         queries/s        ms between answers")
    for (step_ms, switch_ms, pipeline), runs in results.items():
        busy_share = " / ".join(f"{100 * share:3.0f} %" for share, _, _ in runs)
        rate = " / ".join(f"{qps:6.0f}" for _, qps, _ in runs)
        period = " / ".join(f"{ms:5.2f}" for _, _, ms in runs)
        print(f"  {step_ms:5g} ms  {switch_ms:4g} ms  {pipeline:12d}  {busy_share:<18}  {rate:<16}  {period}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="model folder (default: a one-layer MiniLM shape)")
    parser.add_argument("--batch", type=int, default=4, help="queries a batch (a few ms on one core)")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--steps-ms", type=lambda s: [float(x) for x in s.split(",")], default=[0, 1, 3, 10])
    parser.add_argument("--switch-ms", type=lambda s: [float(x) for x in s.split(",")], default=[5, 0.5])
    parser.add_argument("--pipelines", type=lambda s: [int(x) for x in s.split(",")], default=[2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--settle", type=float, default=1.0, help="unmeasured seconds after each change")
    args = parser.parse_args()
    if args.model is not None:
        asyncio.run(measure(args, args.model))
        return
    from make_encoder import make

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(measure(args, make(Path(folder), "minilm-1l", seed=0)))


if __name__ == "__main__":
    main()
