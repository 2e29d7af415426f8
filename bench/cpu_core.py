"""Benchmark of the CPU inference core, 75-token queries.

Sections (each prints a table):
  engine     batch 1/8/32: pinned worker (G=1, all cores) vs the same engine in-process vs
             sentence-transformers `encode` (which also tokenizes); plus the worker's own
             overhead: (await instance.embed) minus the worker's compute time.
  tp         G=2 over two 1-core ranks vs G=1 on one core vs G=1 on both cores.
  allreduce  one shared-memory all-reduce between two ranks pinned to different cores, at
             the size a layer reduces: batch x 75 tokens x hidden floats.

Contenders run interleaved (one call each per round) and medians are reported, so load
from other processes hits all of them alike. Usage:
  python bench/cpu_core.py [--batches 1,8,32] [--rounds 10] [--sections engine,tp,allreduce]

Heavy imports stay inside functions: worker processes do not import this file, but the
all-reduce ranks (multiprocessing spawn) re-import it as their __main__.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial

TOKENS = 75
WORDS = "the of and to in is was for on as with by he at from his it an were are which this be".split()


def make_queries(spec, count: int):
    """`count` texts that tokenize to exactly TOKENS tokens, and their token ids."""
    import numpy as np
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec.path)
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, TOKENS - 2)) for _ in range(count)]
    ids = [np.asarray(row, dtype=np.int32) for row in tokenizer(texts)["input_ids"]]
    assert all(len(row) == TOKENS for row in ids), "each word must be one token"
    return texts, ids


def interleaved(contenders: dict, rounds: int) -> dict[str, list[float]]:
    """Run every contender once per round, in rotating order; seconds per call."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for _ in range(2):  # warm-up
        for call in contenders.values():
            call()
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            started = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - started)
    return times


def print_table(title: str, batch: int, times: dict[str, list[float]]) -> None:
    """Median latency, throughput, and the change against the first contender."""
    first = next(iter(times.values()))
    base = statistics.median(first)
    print(f"\n{title} - batch {batch} x {TOKENS} tokens (median of {len(first)} calls)")
    print(f"  {'contender':<36}{'latency ms':>11}{'emb/s':>9}{'vs row 1':>10}")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:<36}{median * 1e3:>11.1f}{batch / median:>9.1f}{(median / base - 1) * 100:>+9.1f}%")


def run_embed(runner, instance, sequences) -> None:
    runner.run(instance.embed(sequences))


def start(instance, runner) -> None:
    started = time.perf_counter()
    runner.run(instance.start())
    print(f"  started {instance.name}: {time.perf_counter() - started:.1f} s, {instance.info()['ranks']}")


def bench_engine(spec, batches: list[int], rounds: int, skip_st: bool) -> None:
    import asyncio

    import torch

    from windve.engine_process.instance import EngineProcessInstance
    from windve.engines import pad_batch
    from windve.engines.torch_engine import TorchEngine

    cores = sorted(os.sched_getaffinity(0))
    torch.set_num_threads(len(cores))
    texts, ids = make_queries(spec, max(batches))
    engine = TorchEngine(spec, dtype="fp32")
    st_model = None
    if not skip_st:
        from sentence_transformers import SentenceTransformer

        st_model = SentenceTransformer(str(spec.path), device="cpu")
    worker = EngineProcessInstance(spec, name="g1-all-cores", rank_cores=[cores], numa_nodes=[0])
    with asyncio.Runner() as runner:
        start(worker, runner)
        try:
            for batch in batches:
                batch_ids, batch_texts, overhead = ids[:batch], texts[:batch], []

                def pinned_worker(batch_ids=batch_ids, overhead=overhead):
                    began = time.perf_counter()
                    runner.run(worker.embed(batch_ids))
                    overhead.append(time.perf_counter() - began - worker.last_compute_seconds)

                worker_label = f"pinned worker G=1 cores {cores}"
                contenders = {
                    f"in-process torch ({len(cores)} threads)": partial(engine.embed, *pad_batch(batch_ids)),
                    worker_label: pinned_worker,
                }
                if st_model is not None:
                    contenders["sentence-transformers encode"] = partial(
                        st_model.encode, batch_texts, batch_size=batch, normalize_embeddings=False
                    )
                times = interleaved(contenders, rounds)
                print_table("engine", batch, times)
                worker_median = statistics.median(times[worker_label])
                extra = statistics.median(overhead[2:] or overhead)
                print(
                    f"  worker overhead (await embed - worker compute): {extra * 1e3:.2f} ms "
                    f"= {extra / worker_median * 100:.1f}% of the worker's latency"
                )
        finally:
            runner.run(worker.close())


def bench_tp(spec, batches: list[int], rounds: int) -> None:
    import asyncio

    from windve.engine_process.instance import EngineProcessInstance

    _, ids = make_queries(spec, max(batches))
    plans = {
        "G=1, one rank on [0,1] (2 threads)": [[0, 1]],
        "G=1, one rank on [0] (1 thread)": [[0]],
        "G=2, ranks on [0] and [1]": [[0], [1]],
    }
    instances = {
        label: EngineProcessInstance(
            spec, name=f"tp{len(cores)}-{i}", rank_cores=cores, numa_nodes=[0] * len(cores)
        )
        for i, (label, cores) in enumerate(plans.items())
    }
    with asyncio.Runner() as runner:
        for instance in instances.values():
            start(instance, runner)
        try:
            for batch in batches:
                contenders = {
                    label: partial(run_embed, runner, instance, ids[:batch])
                    for label, instance in instances.items()
                }
                print_table("tensor parallelism", batch, interleaved(contenders, rounds))
        finally:
            for instance in instances.values():
                runner.run(instance.close())


def allreduce_rank(path: str, layout, rank: int, sizes: list[int], repeats: int, results) -> None:
    import numpy as np

    from windve.cpu.allreduce import GroupComm

    os.sched_setaffinity(0, {rank % os.cpu_count()})
    comm = GroupComm(path, layout, rank, timeout=30.0)
    for size in sizes:
        values = np.ones(size, np.float32)
        out = np.empty_like(values)
        for _ in range(5):
            comm.all_reduce(values, out)
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            comm.all_reduce(values, out)
            samples.append(time.perf_counter() - started)
        if rank == 0:
            results.put((size, statistics.median(samples), min(samples)))
    comm.close()


def bench_allreduce(batches: list[int], hidden: int, repeats: int) -> None:
    import multiprocessing

    from windve.cpu.allreduce import create_group_segment
    from windve.cpu.layout import GroupLayout

    sizes = [batch * TOKENS * hidden for batch in batches]
    layout = GroupLayout(world=2, reduce_elems=max(sizes), input_bytes=4096)
    segment = create_group_segment(layout)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    try:
        ranks = [
            context.Process(
                target=allreduce_rank, args=(str(segment.path), layout, rank, sizes, repeats, results)
            )
            for rank in range(2)
        ]
        for process in ranks:
            process.start()
        rows = [results.get(timeout=300) for _ in sizes]
        for process in ranks:
            process.join(timeout=60)
    finally:
        segment.unlink()
        segment.close()
    print(f"\nshared-memory all-reduce, 2 ranks on cores 0 and 1 (median / min of {repeats})")
    print(f"  {'batch':>6}{'floats':>10}{'MB/rank':>9}{'median us':>11}{'min us':>9}{'2 per layer ms':>16}")
    for batch, (size, median, best) in zip(batches, rows, strict=True):
        cells = f"{size * 4 / 1e6:>9.2f}{median * 1e6:>11.0f}{best * 1e6:>9.0f}{2 * median * 1e3:>16.2f}"
        print(f"  {batch:>6}{size:>10}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=10, help="timed calls per contender and batch")
    parser.add_argument("--sections", default="engine,tp,allreduce")
    parser.add_argument("--skip-st", action="store_true", help="leave out sentence-transformers")
    parser.add_argument("--allreduce-repeats", type=int, default=200)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from windve.model import load_model_spec

    spec = load_model_spec()
    batches = [int(b) for b in args.batches.split(",")]
    sections = set(args.sections.split(","))
    print(f"model {spec.name}, {os.cpu_count()} CPUs, fp32, {TOKENS}-token queries")
    if "engine" in sections:
        bench_engine(spec, batches, args.rounds, args.skip_st)
    if "tp" in sections:
        bench_tp(spec, batches, args.rounds)
    if "allreduce" in sections:
        bench_allreduce(batches, spec.dim, args.allreduce_repeats)


if __name__ == "__main__":
    main()
