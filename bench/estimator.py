"""Estimator vs stress test vs the true optimum, and token budget vs fixed depth on mixed lengths.

Section `methods` (paper Table III): for each pool, the depth and wall time of
  - the estimate (profile with geometric/aimed levels + linear fit),
  - the stress test (raise C by --step, default 8, until the SLO breaks),
  - the optimum (stress test with step 1),
and whether the estimate lands within 5% of the optimum in <= 25% of the step-8 time.

Section `mixed`: queries of mixed lengths admitted by the 75-token query depth vs by the
token budget from the length-aware fit; which keeps the SLO (p95 over the rounds)?

By default the pools are simulated (a real asyncio server with a known service time, so the
analytic optimum is printed too); `--runtime` profiles the real service pools in-process.
Usage:
  python bench/estimator.py [--slo 0.2] [--rounds 3] [--step 8] [--sections methods,mixed]
  python bench/estimator.py --runtime [--slo 1.0] [--pools cpu]
Figures from a shared, loaded machine move from run to run; rerun before quoting them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

# This script is named like the package it measures: keep its own folder off the import path.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]

from estimator.fit import decide_depth, fit_length_aware, token_budget_for_slo
from estimator.pipeline import fit_profile
from estimator.profile import finite_samples, profile_pool
from estimator.rounds import MakeQuery, Submit, run_round, tail
from estimator.simulated import ServiceTime, SimulatedPool, constant_query
from estimator.stress import stress_test

TOKENS = 75
MIXED_LENGTHS = (16, 75, 256)

# Simulated pools at a 0.2 s SLO: an accelerator-like pool (large batches, ~240 deep) and a
# CPU-like one (~60 deep), so the cost ratio is seen at two depths.
SIMULATED = {
    "sim-accelerator": ServiceTime(per_batch=0.002, per_query=0.0004, per_token=5e-6, max_batch_size=32),
    "sim-cpu": ServiceTime(per_batch=0.001, per_query=0.0015, per_token=2e-5, max_batch_size=8),
}


@dataclass
class Pool:
    name: str
    submit: Submit
    make_query: MakeQuery
    service: ServiceTime | None = None  # known for simulated pools


@dataclass
class MethodResult:
    method: str
    depth: int | None
    seconds: float


async def compare_methods(pool: Pool, slo: float, rounds: int, step: int, max_concurrency: int) -> list[MethodResult]:
    started = time.perf_counter()
    profile = await profile_pool(
        pool.submit, pool.make_query, slo, query_tokens=TOKENS, rounds=rounds, max_concurrency=max_concurrency
    )
    estimate = decide_depth(fit_profile(pool.name, profile.samples), slo, cap=max_concurrency).depth
    results = [MethodResult("estimate (profile + fit)", estimate, time.perf_counter() - started)]
    for label, size in ((f"stress test (step {step})", step), ("optimum (stress test, step 1)", 1)):
        outcome = await stress_test(
            pool.submit, pool.make_query, [slo], step=size, query_tokens=TOKENS, rounds=rounds,
            max_concurrency=max_concurrency,
        )
        results.append(MethodResult(label, outcome.depths[0], outcome.seconds))
    return results


def print_methods(pool: Pool, slo: float, step: int, results: list[MethodResult]) -> None:
    estimate, stress, optimum = results
    best = optimum.depth or 0
    print(f"\n[{pool.name}] SLO {slo:g} s, {TOKENS}-token queries")
    print(f"{'method':<32}{'depth':>7}{'vs optimum':>12}{'wall time (s)':>15}{'vs step-8 time':>16}")
    for result in results:
        error = f"{(result.depth or 0) / best - 1:+.1%}" if best else "-"
        share = f"{result.seconds / stress.seconds:.0%}" if stress.seconds else "-"
        print(f"{result.method:<32}{result.depth or 0:>7}{error:>12}{result.seconds:>15.1f}{share:>16}")
    if pool.service is not None:
        print(f"{'analytic optimum':<32}{pool.service.optimum_depth(slo, TOKENS):>7}")
    accurate = best > 0 and estimate.depth is not None and abs(estimate.depth / best - 1) <= 0.05
    cheap = estimate.seconds <= 0.25 * stress.seconds
    verdict = "MET" if accurate and cheap else "NOT MET"
    print(f"target (within 5% of the optimum in <= 25% of the step-{step} time): {verdict} "
          f"(accuracy {'ok' if accurate else 'missed'}, cost {'ok' if cheap else 'missed'})")


async def mixed_lengths(pool: Pool, slo: float, rounds: int, max_concurrency: int, seed: int = 1) -> None:
    """Fixed 75-token query depth vs token budget, on rounds of uniformly mixed lengths."""
    samples = []
    for tokens in MIXED_LENGTHS:
        profile = await profile_pool(
            pool.submit, pool.make_query, slo, query_tokens=tokens, rounds=rounds, max_concurrency=max_concurrency
        )
        samples.extend(finite_samples(profile.samples))
    at_75 = [s for s in samples if s.tokens == TOKENS]
    depth = decide_depth(fit_profile(pool.name, at_75), slo, cap=max_concurrency).depth or 0
    length_fit = fit_length_aware(
        [s.concurrency for s in samples], [s.tokens for s in samples], [s.p95 for s in samples]
    )
    budget = token_budget_for_slo(length_fit, slo) or 0
    overhead = length_fit.per_query_tokens or 0
    print(f"\n[{pool.name}] mixed lengths {MIXED_LENGTHS} (uniform), SLO {slo:g} s; "
          f"length fit R^2 {length_fit.r2:.4f}; query depth at {TOKENS} tokens = {depth}; "
          f"token budget = {budget} (each query charged its length + {overhead} tokens)")
    print(f"{'admission':<24}{'queries/round':>15}{'p95 (s)':>10}{'max (s)':>10}{'rounds within SLO':>19}")
    policies: dict[str, Callable[[random.Random], list[int]]] = {
        f"fixed depth {depth}": lambda rng: [rng.choice(MIXED_LENGTHS) for _ in range(depth)],
        f"token budget {budget}": lambda rng: _fill_budget(rng, budget, overhead),
    }
    for label, compose in policies.items():
        if not compose(random.Random(seed)):
            print(f"{label:<24}{'admits nothing (unusable at this SLO)':>54}")
            continue
        rng = random.Random(seed)
        latencies: list[float] = []
        met = counted = 0
        for _ in range(max(10, rounds * 3)):
            lengths = compose(rng)
            outcomes = await run_round([(pool.submit, [pool.make_query(n)]) for n in lengths])
            round_latencies = [latency for latency, _ in outcomes]
            latencies.extend(round_latencies)
            met += tail(round_latencies)[0] <= slo
            counted += 1
        p95, worst = tail(latencies)
        print(f"{label:<24}{len(latencies) / counted:>15.1f}{p95:>10.3f}{worst:>10.3f}{f'{met}/{counted}':>19}")


def _fill_budget(rng: random.Random, budget: int, overhead: int) -> list[int]:
    """Admit queries from the stream while their charges (length + overhead) fit the budget."""
    lengths: list[int] = []
    charged = 0
    while True:
        length = rng.choice(MIXED_LENGTHS)
        if charged + length + overhead > budget:
            return lengths
        lengths.append(length)
        charged += length + overhead


async def with_simulated(body: Callable[[list[Pool]], Awaitable[None]], padded: bool) -> None:
    servers = {name: SimulatedPool(dataclasses.replace(service, padded=padded)) for name, service in SIMULATED.items()}
    try:
        await body([Pool(name, server.submit, constant_query, server.service) for name, server in servers.items()])
    finally:
        for server in servers.values():
            await server.close()


async def with_runtime(body: Callable[[list[Pool]], Awaitable[None]], pools: list[str] | None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from windve.service import Runtime
    from windve.settings import load_settings

    runtime = await Runtime.start(load_settings())
    try:
        names = pools or runtime.pool_names
        await body([Pool(name, runtime.pool_submitter(name), runtime.make_query) for name in names])
    finally:
        await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slo", type=float, default=None, help="seconds (default 0.2 simulated, 1.0 runtime)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--step", type=int, default=8)
    parser.add_argument("--max-concurrency", type=int, default=1024)
    parser.add_argument("--sections", default="methods,mixed")
    parser.add_argument("--runtime", action="store_true", help="profile the real service pools in-process")
    parser.add_argument("--pools", help="comma-separated pool names (default: all)")
    args = parser.parse_args()
    slo = args.slo or (1.0 if args.runtime else 0.2)
    sections = set(args.sections.split(","))

    async def body(pools: list[Pool]) -> None:
        chosen = [p for p in pools if not args.pools or p.name in args.pools.split(",")]
        if "methods" in sections:
            for pool in chosen:
                results = await compare_methods(pool, slo, args.rounds, args.step, args.max_concurrency)
                print_methods(pool, slo, args.step, results)
        if "mixed" in sections:
            for pool in chosen:
                await mixed_lengths(pool, slo, args.rounds, args.max_concurrency)

    print(f"bench/estimator.py: {'real runtime' if args.runtime else 'simulated pools'}; shared, loaded machine")
    if args.runtime:
        asyncio.run(with_runtime(body, args.pools.split(",") if args.pools else None))
        return
    asyncio.run(with_simulated(body, padded=False))
    if "mixed" in sections:
        print("\nthe same mixed-length check when a batch is padded to its longest query:")
        sections.discard("methods")
        asyncio.run(with_simulated(body, padded=True))


if __name__ == "__main__":
    main()
