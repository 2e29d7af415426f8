"""An engine's memory over batches of every shape, with and without the heap trim, in one run.

    HF_HUB_OFFLINE=1 python bench/engine_memory.py [--batches 400] [--dtype fp32] [--model DIR]

Each arm runs in a fresh process: one TorchEngine on one thread, `--batches` batches of random
shape (1-32 rows, 2-256 tokens, as a CPU pool forms them), RSS every 100 batches. `trim` calls
windve.engine_process.heap.HeapTrimmer after each batch as the engine process does (at most
every TRIM_SECONDS), `none` does not. The two arms see the same shapes (seed 1).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time


def _rss_mb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))


def _arm(trim: bool, batches: int, dtype: str, model: str | None) -> dict:
    import numpy as np
    import torch

    from windve.engine_process.heap import HeapTrimmer
    from windve.engines.torch_engine import TorchEngine
    from windve.model import load_model_spec

    torch.set_num_threads(1)
    engine = TorchEngine(load_model_spec(model), "cpu", dtype)
    trimmer = HeapTrimmer() if trim else None
    shapes, rng = random.Random(1), np.random.default_rng(1)
    rss, started = [], time.perf_counter()
    for index in range(batches + 1):
        if index % 100 == 0:
            rss.append(_rss_mb())
        if index == batches:
            break
        rows, tokens = shapes.randint(1, 32), shapes.randint(2, 256)
        ids = rng.integers(1000, 20000, size=(rows, tokens)).astype(np.int64)
        engine.embed(ids, np.ones_like(ids))
        if trimmer is not None:
            trimmer.after_batch()
    return {"rss_mb": rss, "seconds": round(time.perf_counter() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--model", default=None, help="a model folder (default: the bundled MiniLM)")
    parser.add_argument("--arm", choices=["trim", "none"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(_arm(args.arm == "trim", args.batches, args.dtype, args.model)))
        return 0
    for arm in ("none", "trim"):
        command = [sys.executable, __file__, "--arm", arm, "--batches", str(args.batches), "--dtype", args.dtype]
        if args.model:
            command += ["--model", args.model]
        result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        print(f"{arm:>4}: RSS MB every 100 batches {result['rss_mb']} ({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
