"""torch.compile against eager for the torch engine's forward, on any device, in one process.

    python bench/compile.py [--model DIR] [--device cpu|cuda:0|npu:0] [--dtype auto]
                            [--batches 8,32,128,512] [--tokens 75] [--modes default]
                            [--threads N] [--rounds 7]

The engine is the one that serves (windve.engines.torch_engine.TorchEngine: staging, the
encoder, pooling, the copy back to the host); its compiled twin shares its weights and swaps
the encoder for `torch.compile(encoder, dynamic=True, mode=MODE)`. For each mode it prints:
- the seconds to the first compiled forward, which every engine process would add to its start,
  and to a forward at a second shape (dynamic shapes: no recompile, so near a plain forward);
- per batch size, eager and compiled queries/s, timed in alternation within the same rounds (a
  machine that changes speed moves both alike, so their ratio holds where the rates swing), and
  the largest cosine distance between the two vectors of a text.

Modes are torch.compile's: `default`, `reduce-overhead` (CUDA graphs on a GPU),
`max-autotune-no-cudagraphs`, `max-autotune`. bench/SERVED.md records what it printed.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from windve.engines.factory import resolve_dtype
from windve.engines.torch_engine import TorchEngine
from windve.model import load_model_spec


def inputs(batch: int, tokens: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random token ids: the time depends on the shape, not on which tokens."""
    ids = np.random.default_rng(seed).integers(1000, vocab, size=(batch, tokens), dtype=np.int64)
    return ids, np.ones_like(ids)


def cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.max(1.0 - np.sum(a * b, axis=1)))


def seconds_of(run) -> float:
    started = time.perf_counter()
    run()  # embed() returns host arrays, so the device has finished when it returns
    return time.perf_counter() - started


def compare(
    eager: TorchEngine, compiled: TorchEngine, batch: tuple[np.ndarray, np.ndarray], rounds: int
) -> tuple[float, float, float]:
    """(eager q/s, compiled q/s, largest cosine distance) at one batch, alternating the two."""
    ids, mask = batch
    reference, candidate = eager.embed(ids, mask), compiled.embed(ids, mask)  # warm both
    eager_times, compiled_times = [], []
    for _ in range(rounds):
        eager_times.append(seconds_of(lambda: eager.embed(ids, mask)))
        compiled_times.append(seconds_of(lambda: compiled.embed(ids, mask)))
    rows = len(ids)
    return (rows / statistics.median(eager_times), rows / statistics.median(compiled_times),
            cosine_distance(reference, candidate))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batches", default="8,32,128,512")
    parser.add_argument("--tokens", type=int, default=75)
    parser.add_argument("--modes", default="default")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    spec = load_model_spec(args.model)
    dtype = resolve_dtype(args.dtype, args.device)
    eager = TorchEngine(spec, args.device, dtype)
    vocab = eager._model.config.vocab_size
    print(f"model {spec.name}, {args.device}, {dtype}, {torch.get_num_threads()} threads, "
          f"{args.tokens}-token queries, torch {torch.__version__}")
    for mode in args.modes.split(","):
        torch._dynamo.reset()
        compiled = copy.copy(eager)
        compiled._model = torch.compile(eager._model, dynamic=True, mode=None if mode == "default" else mode)
        first = seconds_of(lambda: compiled.embed(*inputs(32, args.tokens, vocab, 1)))
        second = seconds_of(lambda: compiled.embed(*inputs(17, args.tokens - 9, vocab, 2)))
        print(f"\n== mode {mode}: first compiled forward {first:.1f} s, then one at a second shape {second:.2f} s")
        print(f"{'batch':>6} {'eager q/s':>10} {'compiled q/s':>13} {'ratio':>6} {'max cos dist':>13}")
        for size in (int(b) for b in args.batches.split(",")):
            plain, fast, distance = compare(eager, compiled, inputs(size, args.tokens, vocab, size), args.rounds)
            print(f"{size:>6} {plain:>10.1f} {fast:>13.1f} {fast / plain:>6.2f} {distance:>13.2e}")


if __name__ == "__main__":
    main()
