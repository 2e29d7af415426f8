"""Embeddings per second of each engine and dtype, beside sentence-transformers, in one run.

75-token queries (the WindVE paper's workload) at batch 1/8/32/128, in-process, all threads
of this machine. Each cell is the best of `--repeats` timed passes over `--queries` queries,
after one untimed pass (kernels meet the shapes first).

    python bench/engines.py [--queries 256] [--repeats 3] [--batches 1,8,32,128] [--model DIR]

`--model` takes a model folder, e.g. one of bench/make_encoder.py's random-weight shapes.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from windve.engines import create_engine, pad_batch
from windve.model import load_model_spec
from windve.tokenizer import TextTokenizer

CANDIDATES = [("torch", "fp32"), ("torch", "bf16"), ("onnx", "fp32")]


def best_rate(run_batch, batches: list, sizes: list[int], repeats: int) -> float:
    for batch in batches[:2]:
        run_batch(batch)
    best = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        done = 0
        for batch, size in zip(batches, sizes):
            run_batch(batch)
            done += size
        best = max(best, done / (time.perf_counter() - started))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1,8,32,128")
    parser.add_argument("--tokens", type=int, default=75)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled all-MiniLM-L6-v2)")
    args = parser.parse_args()
    sizes = [int(size) for size in args.batches.split(",")]

    spec = load_model_spec(args.model)
    tokenizer = TextTokenizer(spec)
    texts = [f"{i} " + tokenizer.text_of_tokens(args.tokens - 1) for i in range(args.queries)]
    sequences = tokenizer.encode(texts, truncate=True)
    threads = torch.get_num_threads()
    print(f"model {spec.name}, {args.queries} queries of ~{args.tokens} tokens, torch threads {threads}")

    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(spec.path), device="cpu")
    engines = {f"{name}-{dtype}": create_engine(spec, name, "cpu", dtype) for name, dtype in CANDIDATES}

    header = f"{'batch':>5} {'sentence-transformers':>22}" + "".join(f"{name:>22}" for name in engines)
    print(header)
    for size in sizes:
        text_batches = [texts[i : i + size] for i in range(0, len(texts), size)]
        id_batches = [pad_batch(sequences[i : i + size]) for i in range(0, len(sequences), size)]
        counts = [len(batch) for batch in text_batches]
        st_rate = best_rate(lambda b: reference.encode(b, batch_size=size), text_batches, counts, args.repeats)
        row = f"{size:>5} {st_rate:>16.1f} emb/s"
        for engine in engines.values():
            rate = best_rate(lambda b: engine.embed(*b), id_batches, counts, args.repeats)
            row += f"{rate:>10.1f} ({rate / st_rate:4.2f}x)".rjust(22)
        print(row)


if __name__ == "__main__":
    main()
