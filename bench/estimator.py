"""Estimator vs stress test vs the true optimum, and token budget vs fixed depth on mixed lengths.

Section `methods` (paper Table III): for each pool, the depth and wall time of
  - the estimate (profile as `windve calibrate`: scouted levels, aimed levels, the settled crossing; linear fit;
    `--scout-aims` / `--full-aims` as in `windve calibrate`),
  - the stress test (raise C by --step, default 8, until the SLO breaks),
  - the optimum (stress test with step 1, swept on past the first miss until --misses
    levels in a row miss, read off an isotonic fit so that one noisy level does not decide),
and whether the estimate lands within 5% of the optimum in <= 25% of the step-8 time.
With --repeats N, the estimate and the stress test run N times each (the optimum once, in
the middle) and the bench counts how often each lands within 5%: on a machine whose speed
changes, one run is one draw. All three aim at the SLO itself (no headroom): this compares the methods, not the margin.

Section `local`: as `methods`, but each run sweeps its own step-1 optimum right after its
estimate and stress test, from 3/4 of the shallower of the two, so that the three meet about
the same machine state (a sweep from C = 1 takes 11-14 minutes here, long enough for this
machine's optimum to move by 15 %). Costlier: each sweep took 6-11 minutes here.

Section `optimum`: the step-1 optimum alone, swept --repeats times (at least 2) in a row, and
how far apart the sweeps land: on a machine whose speed changes, that is the floor under the
accuracy any method can show against one sweep.

Section `mixed`: `windve calibrate`'s pipeline with a length sweep (16, 75, 256 tokens and
the default headroom) gives a query depth at 75 tokens and a token budget. Closed-loop
rounds of mixed lengths are then admitted by each: which keeps the SLO? Two mixes: the
three profiled lengths, and lengths drawn uniformly from 8..256 (not profiled). With
`--runtime`, each round offers twice the query depth to the service's own queue manager,
limited by one policy at a time; what does not fit is refused with BUSY, as in service.

By default the pools are simulated (a real asyncio server with a known service time, so the
analytic optimum is printed too); `--runtime` profiles the real service pools in-process.
Usage:
  python bench/estimator.py [--slo 0.2] [--rounds 3] [--step 8] [--sections methods,mixed]
  python bench/estimator.py --runtime [--slo 1.0] [--pools cpu] [--repeats 5]
  python bench/estimator.py --runtime --sections optimum --rounds 5 --repeats 2
  python bench/estimator.py --runtime --sections local --rounds 5 --repeats 5
Figures from a shared, loaded machine move from run to run; rerun before quoting them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

# This script is named like the package it measures: keep its own folder off the import path.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]

from estimator.fit import LengthFit, decide_depth
from estimator.pipeline import CalibrationOptions, calibrate_pools, fit_profile, profile_with_options
from estimator.recheck import SPEED_TOLERANCE, CrossingCheck, SpeedCheck, crossing_check, recheck_speed
from estimator.report import describe_charge
from estimator.rounds import MakeQuery, Submit, tail
from estimator.simulated import ServiceTime, SimulatedPool, constant_query
from estimator.stress import monotone_depth, stress_test
from queue_manager.pool import TokenCharge
from queue_manager.protocol import Busy
from windve.commands.calibrate import add_profile_arguments, profile_options
from windve.depths import token_charge_for

TOKENS = 75
PROFILED_LENGTHS = (16, 75, 256)
MIXES: dict[str, Callable[[random.Random], int]] = {
    "16/75/256": lambda rng: rng.choice(PROFILED_LENGTHS),
    "uniform 8..256": lambda rng: rng.randint(8, 256),
}

# Simulated pools at a 0.2 s SLO: an accelerator-like pool (large batches, ~240 deep) and a
# CPU-like one (~60 deep), so the cost ratio is seen at two depths.
SIMULATED = {
    "sim-accelerator": ServiceTime(per_batch=0.002, per_query=0.0004, per_token=5e-6, max_batch_size=32),
    "sim-cpu": ServiceTime(
        per_batch=0.001, per_query=0.0015, per_token=2e-5, per_squared_token=4e-8, max_batch_size=8
    ),
}


Limit = Callable[[int, "int | None", TokenCharge], None]


@dataclass
class Pool:
    name: str
    submit: Submit  # straight to the pool, depth not enforced (profiling)
    make_query: MakeQuery
    service: ServiceTime | None = None  # known for simulated pools
    # The service's own admission (queue manager): submit through it, and set its limits.
    admit: Submit | None = None
    limit: Limit | None = None


@dataclass
class MethodResult:
    method: str
    depth: int | None
    seconds: float


@dataclass
class Trial:
    """One estimate and one step-N stress test, back to back, and the machine's speed after each."""

    estimate: MethodResult
    stress: MethodResult
    speeds: list[tuple[str, SpeedCheck]]
    optimum: MethodResult | None = None  # swept right after (section `local`)
    profile_stop: str = ""  # why the estimate's profile stopped, and how it measured its aims
    crossing: CrossingCheck | None = None  # the settled crossing against the SLO


async def run_trial(pool: Pool, slo: float, options: CalibrationOptions, local_misses: int | None = None) -> Trial:
    """The estimate profiles as `windve calibrate` does with `options`; the stress test steps by
    `options.stress_step`."""
    assert options.stress_step is not None, "the bench's options always carry --step"
    rounds, step, max_concurrency = options.rounds, options.stress_step, options.max_concurrency
    started = time.perf_counter()
    profile = await profile_with_options(options, pool.submit, pool.make_query, slo, pool=pool.name, stage="estimate")
    estimate = decide_depth(fit_profile(pool.name, profile.samples), slo, cap=max_concurrency).depth
    estimated = MethodResult("estimate (profile + fit)", estimate, time.perf_counter() - started)
    # The machine's speed after each method, against the profile's: the same level measured
    # again (not counted in any method's time). A shared machine changes speed for seconds
    # to minutes at a time, and each method sees its own share of that.
    speeds: list[tuple[str, SpeedCheck]] = []

    async def note_speed(after: str) -> None:
        check = await recheck_speed(pool.submit, pool.make_query, profile.samples, profile.settled)
        if check is not None:
            speeds.append((after, check))

    await note_speed("after the estimate")
    stress = await stress_test(
        pool.submit, pool.make_query, [slo], step=step, query_tokens=TOKENS, rounds=rounds,
        max_concurrency=max_concurrency,
    )
    await note_speed(f"after step {step}")
    stressed = MethodResult(f"stress test (step {step})", stress.depths[0], stress.seconds)
    optimum = None
    if local_misses is not None:
        start = max(1, min(estimate or 1, stress.depths[0] or 1) * 3 // 4)
        optimum = await sweep_optimum(pool, slo, rounds, max_concurrency, local_misses, start=start)
    crossing = crossing_check(profile.samples, profile.settled, slo)
    return Trial(estimated, stressed, speeds, optimum, profile.stop_reason, crossing)


async def compare_methods(
    pool: Pool, slo: float, options: CalibrationOptions, misses: int, repeats: int, local: bool = False
) -> tuple[list[Trial], MethodResult | None]:
    """`repeats` trials (estimate, then step N) with the step-1 optimum swept once, in the middle,
    so that trials before and after it share out the machine's slow and fast spells; with
    `local`, each trial sweeps its own instead."""
    trials: list[Trial] = []
    optimum = None

    async def run_one() -> Trial:
        return await run_trial(pool, slo, options, misses if local else None)

    for _ in range((repeats + 1) // 2):
        trials.append(await run_one())
    if not local:
        optimum = await sweep_optimum(pool, slo, options.rounds, options.max_concurrency, misses)
    for _ in range(repeats // 2):
        trials.append(await run_one())
    for number, trial in enumerate(trials, 1):
        print(f"[{pool.name}] run {number}: the estimate's profile stopped: {trial.profile_stop}")
        if trial.speeds:
            reference = trial.speeds[0][1]
            print(f"[{pool.name}] run {number}: p95 of the profile's C={reference.concurrency} level "
                  f"({reference.profile_p95:.3f} s in the profile) measured again: "
                  f"{', '.join(f'{after} {check.ratio:.2f}x' for after, check in trial.speeds)}")
        if trial.crossing is not None:
            held = "within" if trial.crossing.steady else "NOT within"
            print(f"[{pool.name}] run {number}: the settled crossing C={trial.crossing.concurrency} took "
                  f"{trial.crossing.ratio:.2f}x the SLO ({held} {SPEED_TOLERANCE:.0%})")
    return trials, optimum


async def sweep_optimum(
    pool: Pool, slo: float, rounds: int, max_concurrency: int, misses: int, start: int = 1
) -> MethodResult:
    """The step-1 sweep from `start` until `misses` levels in a row miss, read off an isotonic fit.
    Its depth is None when even `start` misses: the optimum lies below where the sweep began."""
    sweep = await stress_test(
        pool.submit, pool.make_query, [slo], step=1, query_tokens=TOKENS, rounds=rounds,
        max_concurrency=max_concurrency, misses_to_stop=misses, start=start,
    )
    print(f"[{pool.name}] step-1 sweep from C={start}: first miss after C={sweep.depths[0]}, "
          f"{len(sweep.samples)} levels, stopped: {sweep.stop_reason}")
    return MethodResult("optimum (step 1, isotonic)", monotone_depth(sweep.samples, slo) or None, sweep.seconds)


async def optimum_spread(pool: Pool, slo: float, rounds: int, max_concurrency: int, misses: int, sweeps: int) -> None:
    """The step-1 optimum swept again and again: how far apart two sweeps land is the floor
    under the accuracy of any method on this machine."""
    depths = []
    for number in range(1, sweeps + 1):
        optimum = await sweep_optimum(pool, slo, rounds, max_concurrency, misses)
        depths.append(optimum.depth or 0)
        print(f"[{pool.name}] optimum sweep {number}: {optimum.depth} in {optimum.seconds:.0f} s")
    low, high, median = min(depths), max(depths), statistics.median(depths)
    apart = f"{high / low - 1:.1%}" if low else "-"
    print(f"[{pool.name}] {sweeps} optimum sweeps: {', '.join(map(str, depths))}; the deepest is {apart} above the "
          f"shallowest; within 5% of their median: {sum(within(d, median) for d in depths)}/{sweeps}")


def within(depth: int | None, optimum: float) -> bool:
    return optimum > 0 and depth is not None and abs(depth / optimum - 1) <= 0.05


def print_methods(pool: Pool, slo: float, step: int, trials: list[Trial], optimum: MethodResult | None) -> None:
    """One line per run against the one optimum, or against each run's own (section `local`)."""

    def best(trial: Trial) -> int:
        return ((trial.optimum if optimum is None else optimum).depth) or 0

    def error(result: MethodResult, trial: Trial) -> str:
        return f"{(result.depth or 0) / best(trial) - 1:+.1%}" if best(trial) else "-"

    print(f"\n[{pool.name}] SLO {slo:g} s, {TOKENS}-token queries; optimum (step 1, isotonic) ", end="")
    if optimum is not None:
        print(f"{optimum.depth} in {optimum.seconds:.1f} s")
    else:
        print("swept after each run: " + ", ".join(
            f"{trial.optimum.depth} in {trial.optimum.seconds:.0f} s" for trial in trials if trial.optimum
        ))
    if pool.service is not None:
        print(f"analytic optimum {pool.service.optimum_depth(slo, TOKENS)}")
    print(f"{'run':<5}{'optimum':>8}{'estimate':>9}{'vs opt':>9}{'time (s)':>10}{f'step {step}':>9}{'vs opt':>9}"
          f"{'time (s)':>10}{'est/step time':>15}  target (within 5% of the optimum in <= 25% of the step-{step} time)")
    met = 0
    for number, trial in enumerate(trials, 1):
        estimate, stress = trial.estimate, trial.stress
        share = estimate.seconds / stress.seconds if stress.seconds else float("inf")
        accurate, cheap = within(estimate.depth, best(trial)), share <= 0.25
        met += accurate and cheap
        verdict = "MET" if accurate and cheap else (
            f"NOT MET (accuracy {'ok' if accurate else 'missed'}, cost {'ok' if cheap else 'missed'})"
        )
        print(f"{number:<5}{best(trial) or '-':>8}{estimate.depth or 0:>9}{error(estimate, trial):>9}"
              f"{estimate.seconds:>10.1f}{stress.depth or 0:>9}{error(stress, trial):>9}{stress.seconds:>10.1f}"
              f"{share:>15.0%}  {verdict}")
    count = len(trials)
    print(f"within 5% of the optimum: estimate {sum(within(t.estimate.depth, best(t)) for t in trials)}/{count}, "
          f"step {step} {sum(within(t.stress.depth, best(t)) for t in trials)}/{count}; "
          f"target met in {met}/{count} runs")


async def mixed_lengths(pool: Pool, slo: float, options: CalibrationOptions, seed: int = 1) -> None:
    """Fixed 75-token query depth vs token budget, both from one calibration, on mixed rounds."""
    options = dataclasses.replace(options, lengths=PROFILED_LENGTHS, stress_step=None)  # no stress test here
    calibration = await calibrate_pools(
        {pool.name: pool.submit}, pool.make_query, options,
        model_name="bench", model_revision="-", hardware_fingerprint="-",
    )
    calibrated = calibration.pools[pool.name]
    entry, fit = calibrated.at(slo), calibrated.length_fit
    assert fit is not None
    depth, budget = entry.estimate or 0, entry.token_budget or 0
    print(f"\n[{pool.name}] SLO {slo:g} s, headroom {options.headroom:.0%}; length fit "
          f"t = C*({fit.per_token:.3g}*L + {fit.per_token_squared:.3g}*L^2 + {fit.per_query:.3g}) + {fit.constant:.3g} "
          f"(R^2 {fit.r2:.4f}); query depth at {TOKENS} tokens = {depth}; token budget = {budget} "
          f"({describe_charge(fit)})")
    print(f"{'mix':<16}{'admission':<20}{'admitted/round':>15}{'refused/round':>14}{'p95 (s)':>10}{'max (s)':>10}"
          f"{'rounds within SLO':>19}")
    for mix_name, draw in MIXES.items():
        if pool.admit is not None and pool.limit is not None:
            # Through the service's queue manager: offer more than either policy admits at once;
            # what does not fit gets BUSY at once, as in service.
            offered = 2 * depth
            limits = {
                f"fixed depth {depth}": (depth, None, TokenCharge()),
                f"token budget {budget}": (10 * offered, budget, token_charge_for(fit)),
            }
            for label, (query_depth, token_budget, charge) in limits.items():
                pool.limit(query_depth, token_budget, charge)
                await _check_policy(
                    pool, pool.admit, slo, mix_name, label, lambda rng: [draw(rng) for _ in range(offered)],
                    max(10, options.rounds * 3), seed,
                )
            continue
        policies: dict[str, Callable[[random.Random], list[int]]] = {
            f"fixed depth {depth}": lambda rng: [draw(rng) for _ in range(depth)],
            f"token budget {budget}": lambda rng: _fill_budget(rng, draw, budget, fit),
        }
        for label, compose in policies.items():
            await _check_policy(pool, pool.submit, slo, mix_name, label, compose, max(10, options.rounds * 3), seed)


async def _check_policy(
    pool: Pool, submit: Submit, slo: float, mix: str, label: str, compose: Callable[[random.Random], list[int]],
    rounds: int, seed: int,
) -> None:
    if not compose(random.Random(seed)):
        print(f"{mix:<16}{label:<20}{'admits nothing (unusable at this SLO)':>54}")
        return
    rng = random.Random(seed)
    latencies: list[float] = []
    met = refused = 0
    for _ in range(rounds):
        outcomes = await asyncio.gather(*(_timed(submit, pool.make_query(n)) for n in compose(rng)))
        answered = [latency for latency in outcomes if latency is not None]
        refused += len(outcomes) - len(answered)
        latencies.extend(answered)
        met += bool(answered) and tail(answered)[0] <= slo
    p95, worst = tail(latencies)
    print(f"{mix:<16}{label:<20}{len(latencies) / rounds:>15.1f}{refused / rounds:>14.1f}{p95:>10.3f}{worst:>10.3f}"
          f"{f'{met}/{rounds}':>19}")


async def _timed(submit: Submit, query) -> float | None:
    """Seconds until answered, or None when refused with BUSY."""
    started = time.perf_counter()
    try:
        await submit([query])
    except Busy:
        return None
    return time.perf_counter() - started


def _fill_budget(rng: random.Random, draw: Callable[[random.Random], int], budget: int, fit: LengthFit) -> list[int]:
    """Admit queries from the stream while their charges fit the budget, as the queue manager does."""
    lengths: list[int] = []
    charged = 0
    while True:
        length = draw(rng)
        if charged + fit.charge(length) > budget:
            return lengths
        lengths.append(length)
        charged += fit.charge(length)


async def with_simulated(body: Callable[[list[Pool]], Awaitable[None]], padded: bool) -> None:
    servers = {name: SimulatedPool(dataclasses.replace(service, padded=padded)) for name, service in SIMULATED.items()}
    try:
        await body([Pool(name, server.submit, constant_query, server.service) for name, server in servers.items()])
    finally:
        for server in servers.values():
            await server.close()


async def with_runtime(body: Callable[[list[Pool]], Awaitable[None]], pools: list[str] | None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from windve.gc_tuning import tune_gc_for_serving
    from windve.service import Runtime
    from windve.settings import load_settings

    runtime = await Runtime.start(load_settings())
    tune_gc_for_serving()  # as `windve serve` and `windve calibrate` do once the runtime is up
    try:
        names = pools or runtime.pool_names
        qm = runtime.queue_manager

        def limiter(name: str) -> Limit:
            return lambda depth, budget, charge: qm.set_depth(name, depth, budget, charge)

        await body([
            Pool(name, runtime.pool_submitter(name), runtime.make_query, admit=qm.submit, limit=limiter(name))
            for name in names
        ])
    finally:
        await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slo", type=float, default=None, help="seconds (default 0.2 simulated, 1.0 runtime)")
    # The profile's flags as `windve calibrate` has them; fewer rounds and a deeper cap by default here.
    add_profile_arguments(parser)
    parser.set_defaults(rounds=3, max_concurrency=1024)
    parser.add_argument("--misses", type=int, default=8,
                        help="the step-1 optimum sweep stops after this many levels in a row miss")
    parser.add_argument("--repeats", type=int, default=1,
                        help="estimate and step-N runs against the one step-1 optimum: one run on a machine "
                             "that changes speed shows one draw, not how often the target holds")
    parser.add_argument("--sections", default="methods,mixed")
    parser.add_argument("--runtime", action="store_true", help="profile the real service pools in-process")
    parser.add_argument("--pools", help="comma-separated pool names (default: all)")
    args = parser.parse_args()
    slo = args.slo or (1.0 if args.runtime else 0.2)
    sections = set(args.sections.split(","))
    options = CalibrationOptions(slos=(slo,), query_tokens=TOKENS, stress_step=args.step, **profile_options(args))

    async def body(pools: list[Pool]) -> None:
        chosen = [p for p in pools if not args.pools or p.name in args.pools.split(",")]
        for section in ("methods", "local"):
            for pool in chosen if section in sections else []:
                trials, optimum = await compare_methods(
                    pool, slo, options, args.misses, args.repeats, local=section == "local"
                )
                print_methods(pool, slo, args.step, trials, optimum)
        if "optimum" in sections:
            for pool in chosen:
                await optimum_spread(
                    pool, slo, options.rounds, options.max_concurrency, args.misses, max(2, args.repeats)
                )
        if "mixed" in sections:
            for pool in chosen:
                await mixed_lengths(pool, slo, options)

    print(f"bench/estimator.py: {'real runtime' if args.runtime else 'simulated pools'}; shared, loaded machine")
    if args.runtime:
        asyncio.run(with_runtime(body, args.pools.split(",") if args.pools else None))
        return
    asyncio.run(with_simulated(body, padded=False))
    if "mixed" in sections:
        print("\nthe same check on a FIFO batcher that pads each batch to its longest query (no length grouping):")
        sections.discard("methods")
        asyncio.run(with_simulated(body, padded=True))


if __name__ == "__main__":
    main()
