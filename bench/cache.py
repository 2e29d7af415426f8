"""Latency of an all-hit request vs a miss: the cache layer itself vs embedding the same texts.

Run from the repository root (needs /usr/bin/redis-server; starts its own on a free port):

    python bench/cache.py [--repeat 300] [--engine-repeat 10]

For 1 and 32 texts of about 75 tokens it prints, as median and p99 in milliseconds:
- hit:  cache keys (sha256 of each text) + get_many, every key cached;
- miss: cache keys + get_many (all miss) + put_many, i.e. what the cache adds to a miss;
- embed: tokenize + engine.embed + normalize (torch, cpu, fp32), what a hit saves;
for the in-process LRU, Redis without an L1 (every lookup a round trip) and Redis behind a
warm L1; then the same over HTTP: a real `windve serve` sharing a real redis-server, timing a
request whose texts were never seen (miss: queued and embedded) against the same request sent
again (all hit: answered without a queue slot). Figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.redis_server

import httpx  # noqa: E402

from tests.redis_server import start_on_free_port  # noqa: E402
from tests.servers import start_server  # noqa: E402
from windve.cache import cache_keys, create_cache  # noqa: E402
from windve.settings import Settings  # noqa: E402

SENTENCE = (
    "the service embeds short queries for retrieval augmented generation and answers within its latency "
    "objective while the accelerator serves steady load and idle processor cores take the overflow of a burst"
)
WORDS = SENTENCE.split()


def make_texts(count: int, words: int = 60, offset: int = 0) -> list[str]:
    """Distinct texts of about 75 tokens each (the paper's query length)."""
    return [
        " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(words)) + f" #{offset + i}"
        for i in range(count)
    ]


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return f"{statistics.median(ordered) * 1e3:9.3f} {p99 * 1e3:9.3f}"


async def time_async(operation: Callable[[], Awaitable[object]], repeat: int) -> list[float]:
    await operation()  # warm-up: connections, allocator
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await operation()
        samples.append(time.perf_counter() - started)
    return samples


async def bench_cache(name: str, settings: Settings, l1_entries: int | None, repeat: int, dim: int) -> None:
    for count in (1, 32):
        hit, miss = await cache_figures(name, settings, l1_entries, count, repeat, dim)
        print(f"{name:<22} {count:>5} {'hit':<6} {summary(hit)}")
        print(f"{name:<22} {count:>5} {'miss':<6} {summary(miss)}")


async def cache_figures(
    name: str, settings: Settings, l1_entries: int | None, count: int, repeat: int, dim: int
) -> tuple[list[float], list[float]]:
    """Seconds per all-hit and per all-miss request of `count` texts."""
    model, revision = "bench-model", f"{name}-{count}"  # own keys: the runs share one Redis server
    cache = create_cache(settings) if l1_entries is None else create_cache(settings, l1_entries=l1_entries)
    cached_texts = make_texts(count)
    vectors = np.random.default_rng(0).standard_normal((count, dim), dtype=np.float32)
    tokens = [75] * count  # the entries' token counts: stored and read back as in serving
    await cache.put_many(cache_keys(model, revision, True, True, cached_texts), vectors, tokens)
    # never-cached texts, built before timing so that only the cache's work is measured
    fresh = iter([make_texts(count, offset=(i + 1) * 1000) for i in range(repeat + 1)])

    async def hit() -> None:
        found = await cache.get_many(cache_keys(model, revision, True, True, cached_texts))
        assert all(entry is not None for entry in found)

    async def miss() -> None:
        keys = cache_keys(model, revision, True, True, next(fresh))
        found = await cache.get_many(keys)
        assert all(entry is None for entry in found)
        await cache.put_many(keys, vectors, tokens)

    try:
        return await time_async(hit, repeat), await time_async(miss, repeat)
    finally:
        await cache.close()


def embed_figures(engine, tokenizer, texts: list[str], repeat: int) -> tuple[list[float], int]:
    """Seconds per tokenize + embed + normalize of `texts`, and the tokens of one text."""
    from windve.engines import pad_batch

    def embed() -> np.ndarray:
        encodings = tokenizer.encode_batch(texts)
        ids, mask = pad_batch([np.asarray(encoding.ids, dtype=np.int64) for encoding in encodings])
        pooled = engine.embed(ids, mask)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    embed()  # warm-up
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        embed()
        samples.append(time.perf_counter() - started)
    return samples, len(tokenizer.encode(texts[0]).ids)


def bench_engine(repeat: int) -> int:
    from tokenizers import Tokenizer

    from windve.engines import create_engine
    from windve.model import load_model_spec

    spec = load_model_spec()
    engine = create_engine(spec, "torch", "cpu", "fp32")
    tokenizer = Tokenizer.from_file(str(spec.path / "tokenizer.json"))
    tokenizer.no_padding()  # the file pads to a fixed 128; pad_batch pads to the longest instead
    tokenizer.enable_truncation(spec.max_seq_length)
    for count in (1, 32):
        samples, tokens = embed_figures(engine, tokenizer, make_texts(count), repeat)
        print(
            f"{'engine torch cpu fp32':<22} {count:>5} {'embed':<6} {summary(samples)}   ({tokens} tokens/text)"
        )
    return spec.dim


def http_figures(redis_url: str, repeat: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="windve-bench-serve-"))
    server = start_server(workdir, "--redis-url", redis_url)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for count in (1, 32):
                misses, hits = [], []
                for round_index in range(repeat):
                    body = {"inputs": make_texts(count, offset=10_000 * (count + 1) + 100 * round_index)}
                    started = time.perf_counter()
                    first = client.post("/embed", json=body)
                    misses.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    again = client.post("/embed", json=body)
                    hits.append(time.perf_counter() - started)
                    assert first.status_code == again.status_code == 200 and first.content == again.content
                print(f"{'HTTP /embed, redis':<22} {count:>5} {'miss':<6} {summary(misses)}")
                print(f"{'HTTP /embed, redis':<22} {count:>5} {'hit':<6} {summary(hits)}")
    finally:
        server.stop()


async def main_async(args: argparse.Namespace, dim: int) -> None:
    base = {"cache_size": 100_000, "cache_ttl_seconds": 3600, "redis_timeout_seconds": 0.5}
    await bench_cache("local LRU", Settings(redis_url=None, **base), None, args.repeat, dim)
    server = start_on_free_port(Path(tempfile.mkdtemp(prefix="windve-bench-redis-")))
    try:
        redis_settings = Settings(redis_url=server.url, **base)
        await bench_cache("redis (no L1)", redis_settings, 0, args.repeat, dim)
        await bench_cache("redis + warm L1", redis_settings, None, args.repeat, dim)
        await asyncio.to_thread(http_figures, server.url, args.http_repeat)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=300, help="timed calls per cache figure")
    parser.add_argument("--engine-repeat", type=int, default=10, help="timed calls per engine figure")
    parser.add_argument("--http-repeat", type=int, default=30, help="request pairs per HTTP figure")
    args = parser.parse_args()
    print(f"{'what':<22} {'texts':>5} {'call':<6} {'median ms':>9} {'p99 ms':>9}")
    dim = bench_engine(args.engine_repeat)
    asyncio.run(main_async(args, dim))


if __name__ == "__main__":
    main()
