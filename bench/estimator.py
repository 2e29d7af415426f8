"""The estimator against the stress test, and the token budget against a fixed depth on mixed lengths.

Section `methods` (paper Table III): for each pool, the depth and time of
  - the estimate (the profile and fit of `windve calibrate`, with its --rounds and --max-concurrency),
  - the stress test with --step (the paper's baseline, 8 by default),
  - the reference: a step-1 stress test, swept on until --misses levels in a row miss (8 by default) and
    read off an isotonic fit, so that one noisy level does not decide (with p99, one slow request of a
    level of fewer than 100 does: a plain step-1 test here once stopped at 42 where the pool held 164);
    its time is what the sweep took up to the level past that depth, where a step-1 test that read
    the depth right would stop,
and whether the estimate lands within 5 % of the reference in <= 25 % of the reference's time (the
target). With --repeats N, the estimate and the step-N test run N times, the reference once in the
middle: on a machine whose speed changes, one run is one draw. With --references M the reference runs M
times, spread among the repeats, and the bench prints how far apart its depths came. All aim at the SLO
itself (no headroom): this compares the methods, not the margin.

Section `mixed` (simulated and --in-process pools): `windve calibrate`'s pipeline with lengths 16, 75 and
256 and the default headroom gives a query depth at 75 tokens and a token budget; closed-loop rounds of
mixed lengths are then admitted by each. With --in-process, each round offers twice the query depth to
the service's own queue manager, limited by one policy at a time; what does not fit is refused (BUSY).

Pools: simulated by default (a real asyncio server with a known service time, on a virtual clock: exact,
done in a moment, and the analytic optimum is printed too); --served starts `windve serve` for each pool
and measures it over HTTP, as `windve calibrate` does; --in-process profiles the service runtime in this
process. Times of simulated pools are virtual seconds, what the methods would take on such a pool.
Usage:
  python bench/estimator.py [--slo 0.2] [--rounds 5] [--step 8] [--sections methods,mixed]
  python bench/estimator.py --served [--slo 1.0] [--pools cpu] [--repeats 3]
  python bench/estimator.py --in-process --sections mixed
Figures from a shared, loaded machine move from run to run; rerun before quoting them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# This script is named like the package it measures: keep its own folder off the import path.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]

from estimator.fit import LengthFit
from estimator.pipeline import CalibrationOptions, calibrate_pool, fit_profile
from estimator.profile import ProfileOptions, decide_profile_depth, profile_pool
from estimator.recheck import SPEED_TOLERANCE, CrossingCheck, SpeedCheck, crossing_check, recheck_speed
from estimator.report import describe_charge
from estimator.rounds import MakeQuery, Progress, Submit, tail
from estimator.simulated import ServiceTime, SimulatedPool, constant_query, run_virtual
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

# Simulated pools at a 0.2 s SLO: an accelerator-like pool (large batches, ~240 deep) and a CPU-like
# one (~60 deep), so that the cost ratio is seen at two depths.
SIMULATED = {
    "sim-accelerator": ServiceTime(per_batch=0.002, per_query=0.0004, per_token=5e-6, max_batch_size=32),
    "sim-cpu": ServiceTime(
        per_batch=0.001, per_query=0.0015, per_token=2e-5, per_squared_token=4e-8, max_batch_size=8
    ),
}


@dataclass
class Pool:
    name: str
    submit: Submit  # straight to the pool
    make_query: MakeQuery
    service: ServiceTime | None = None  # known for simulated pools
    queue_manager: Any = None  # in-process: the service's own admission, for section `mixed`


@dataclass
class MethodResult:
    depth: int | None
    seconds: float


@dataclass
class Trial:
    """One estimate and one step-N stress test, back to back, and the machine's speed after each."""

    estimate: MethodResult
    stress: MethodResult
    speeds: list[tuple[str, SpeedCheck]]
    profile_stop: str
    crossing: CrossingCheck | None  # the settled crossing against the SLO


def _now() -> float:
    return asyncio.get_running_loop().time()


async def run_trial(pool: Pool, slo: float, options: ProfileOptions, step: int) -> Trial:
    started = _now()
    profile = await profile_pool(pool.submit, pool.make_query, slo, options, pool=pool.name, stage="estimate")
    fit = fit_profile(pool.name, profile.samples)
    estimate = decide_profile_depth(profile.samples, fit, slo, cap=options.max_concurrency).depth
    estimated = MethodResult(estimate, _now() - started)
    # The settled level measured again after each method (not counted in any method's time): a shared
    # machine changes speed for seconds to minutes at a time, and each method sees its own share of that.
    speeds: list[tuple[str, SpeedCheck]] = []

    async def note_speed(after: str) -> None:
        check = await recheck_speed(pool.submit, pool.make_query, profile.samples, profile.settled)
        if check is not None:
            speeds.append((after, check))

    await note_speed("after the estimate")
    stress = await stress_test(pool.submit, pool.make_query, [slo], options, step=step)
    await note_speed(f"after step {step}")
    crossing = crossing_check(profile.samples, profile.settled, slo)
    return Trial(estimated, MethodResult(stress.depths[0], stress.seconds), speeds, profile.stop_reason, crossing)


async def reference(pool: Pool, slo: float, options: ProfileOptions, misses: int) -> MethodResult:
    """The step-1 stress test, swept on until `misses` levels in a row miss and read off an isotonic fit;
    its time up to the level past that depth (the whole sweep when it never got there)."""
    started = _now()
    reached: dict[int, float] = {}

    def note(event: Progress) -> None:
        if event.sample is not None:
            reached[event.concurrency] = _now() - started

    sweep = await stress_test(
        pool.submit, pool.make_query, [slo], options, step=1, misses_to_stop=misses, progress=note
    )
    depth = monotone_depth(sweep.samples, slo)
    seconds = reached.get(depth + 1, sweep.seconds)
    print(f"[{pool.name}] step-1 stress test: first miss after C={sweep.depths[0]}, {len(sweep.samples)} levels in "
          f"{sweep.seconds:.1f} s, stopped: {sweep.stop_reason}; isotonic depth {depth}, reached C={depth + 1} "
          f"in {seconds:.1f} s")
    return MethodResult(depth or None, seconds)


def within(depth: int | None, best: int | None) -> bool:
    return bool(best) and depth is not None and abs(depth / best - 1) <= 0.05


def reference_slots(repeats: int, references: int) -> list[int]:
    """How many trials run before each reference: spread evenly, the first after half of them when
    there is one."""
    return [((k + 1) * repeats + references) // (references + 1) for k in range(references)]


async def compare_methods(pool: Pool, slo: float, options: ProfileOptions, step: int, misses: int,
                          repeats: int, references: int = 1) -> None:
    trials: list[Trial] = []
    refs: list[MethodResult] = []
    for before in reference_slots(repeats, references):
        trials += [await run_trial(pool, slo, options, step) for _ in range(before - len(trials))]
        refs.append(await reference(pool, slo, options, misses))
    trials += [await run_trial(pool, slo, options, step) for _ in range(repeats - len(trials))]
    best = refs[0]
    print(f"\n[{pool.name}] SLO {slo:g} s, {TOKENS}-token queries; step-1 stress test {best.depth} in "
          f"{best.seconds:.1f} s" + (f"; analytic optimum {pool.service.optimum_depth(slo, TOKENS)}"
                                     if pool.service else ""))
    print(f"{'run':<5}{'estimate':>9}{'vs step 1':>10}{'time (s)':>10}{'/ step 1':>9}{f'step {step}':>8}"
          f"{'time (s)':>10}{'/ step N':>9}  target: within 5% of step 1 in <= 25% of its time")
    met = 0
    for number, trial in enumerate(trials, 1):
        estimate, stress = trial.estimate, trial.stress
        share = estimate.seconds / best.seconds if best.seconds else float("inf")
        error = f"{(estimate.depth or 0) / best.depth - 1:+.1%}" if best.depth else "-"
        accurate, cheap = within(estimate.depth, best.depth), share <= 0.25
        met += accurate and cheap
        missed = [what for what, ok in (("accuracy", accurate), ("cost", cheap)) if not ok]
        verdict = f"missed ({', '.join(missed)})" if missed else "met"
        print(f"{number:<5}{estimate.depth or 0:>9}{error:>10}{estimate.seconds:>10.1f}{share:>9.0%}"
              f"{stress.depth or 0:>8}{stress.seconds:>10.1f}{estimate.seconds / stress.seconds:>9.0%}  {verdict}")
        print(f"      stopped: {trial.profile_stop}")
        notes = [f"that level {after}: {check.ratio:.2f}x" for after, check in trial.speeds]
        if trial.crossing is not None:
            held = "within" if trial.crossing.steady else "NOT within"
            notes.insert(0, f"settled C={trial.crossing.concurrency}: {trial.crossing.ratio:.2f}x the SLO "
                            f"({held} {SPEED_TOLERANCE:.0%})")
        print(f"      {'; '.join(notes)}")
    count = len(trials)
    print(f"within 5% of step 1: estimate {sum(within(t.estimate.depth, best.depth) for t in trials)}/{count}, "
          f"step {step} {sum(within(t.stress.depth, best.depth) for t in trials)}/{count}; "
          f"target met in {met}/{count} runs")
    if len(refs) > 1:
        # The reference is a measurement too: on a machine whose speed drifts, two step-1 tests of the same
        # pool in one run set the floor under any "within 5 %" judged against one of them.
        depths = [r.depth or 0 for r in refs]
        spread = max(depths) / min(depths) - 1 if min(depths) else float("inf")
        print(f"the step-1 tests against each other: {', '.join(map(str, depths))} ({spread:.1%} apart)")
        for number, ref in enumerate(refs[1:], 2):
            print(f"  against step-1 test {number} ({ref.depth}): estimate within 5% in "
                  f"{sum(within(t.estimate.depth, ref.depth) for t in trials)}/{count}")


async def mixed_lengths(pool: Pool, slo: float, options: ProfileOptions, seed: int = 1) -> None:
    """Fixed 75-token query depth vs token budget, both from one calibration, on mixed rounds."""
    calibration_options = CalibrationOptions(slos=(slo,), profile=options, lengths=PROFILED_LENGTHS)
    calibrated = await calibrate_pool(pool.name, pool.submit, pool.make_query, calibration_options)
    entry, fit = calibrated.at(slo), calibrated.length_fit
    assert fit is not None
    depth, budget = entry.estimate or 0, entry.token_budget or 0
    print(f"\n[{pool.name}] SLO {slo:g} s, headroom {calibration_options.headroom:.0%}; length fit "
          f"t = C*({fit.per_token:.3g}*L + {fit.per_token_squared:.3g}*L^2 + {fit.per_query:.3g}) + {fit.constant:.3g} "
          f"(R^2 {fit.r2:.4f}); query depth at {TOKENS} tokens = {depth}; token budget = {budget} "
          f"({describe_charge(fit)})")
    print(f"{'mix':<16}{'admission':<20}{'admitted/round':>15}{'refused/round':>14}{'p99 (s)':>10}{'max (s)':>10}"
          f"{'rounds within SLO':>19}")
    rounds = max(10, options.rounds * 3)
    for mix_name, draw in MIXES.items():
        qm = pool.queue_manager
        if qm is not None:
            # Through the service's queue manager: offer more than either policy admits at once.
            offered = 2 * depth
            limits = {
                f"fixed depth {depth}": (depth, None, TokenCharge()),
                f"token budget {budget}": (10 * offered, budget, token_charge_for(fit)),
            }
            for label, (query_depth, token_budget, charge) in limits.items():
                qm.set_depth(pool.name, query_depth, token_budget, charge)
                await _check_policy(pool, qm.submit, slo, mix_name, label,
                                    lambda rng: [draw(rng) for _ in range(offered)], rounds, seed)
            continue
        policies: dict[str, Callable[[random.Random], list[int]]] = {
            f"fixed depth {depth}": lambda rng: [draw(rng) for _ in range(depth)],
            f"token budget {budget}": lambda rng: _fill_budget(rng, draw, budget, fit),
        }
        for label, compose in policies.items():
            await _check_policy(pool, pool.submit, slo, mix_name, label, compose, rounds, seed)


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
    p99, worst = tail(latencies)
    print(f"{mix:<16}{label:<20}{len(latencies) / rounds:>15.1f}{refused / rounds:>14.1f}{p99:>10.3f}{worst:>10.3f}"
          f"{f'{met}/{rounds}':>19}")


async def _timed(submit: Submit, query) -> float | None:
    """Seconds until answered, or None when refused with BUSY."""
    started = _now()
    try:
        await submit([query])
    except Busy:
        return None
    return _now() - started


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


async def simulated_pools(names: list[str] | None, padded: bool) -> AsyncIterator[Pool]:
    for name, service in SIMULATED.items():
        if names and name not in names:
            continue
        server = SimulatedPool(dataclasses.replace(service, padded=padded))
        try:
            yield Pool(name, server.submit, constant_query, server.service)
        finally:
            await server.close()


async def service_pools(names: list[str] | None, served: bool) -> AsyncIterator[Pool]:
    """Each pool of this machine's plan alone, as `windve calibrate` opens it (over HTTP with `served`)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import devices
    from estimator.http_pool import ExactLengthTexts
    from windve.commands.calibrate import allow_open_files, pool_settings, served_pool_opener
    from windve.gc_tuning import tune_gc_for_serving
    from windve.model import load_model_spec
    from windve.service import Runtime, make_plan
    from windve.settings import load_settings
    from windve.tokenizer import load_fast_tokenizer

    settings = load_settings()
    spec = load_model_spec(settings.model, settings.revision, settings.trust_remote_code)
    texts = ExactLengthTexts(load_fast_tokenizer(spec.path))
    plan = make_plan(settings, devices.detect_hardware(settings.sysfs_root))
    open_served = served_pool_opener(texts)
    for name in names or [pool.name for pool in plan.pools]:
        alone = pool_settings(settings, plan, name)
        if served:
            allow_open_files(10_000)
            async with open_served(alone) as submit:
                tune_gc_for_serving()  # this process times the pool, as `windve calibrate` does
                yield Pool(name, submit, texts.make_query)
            continue
        runtime = await Runtime.start(alone)
        try:
            tune_gc_for_serving()
            yield Pool(name, runtime.pool_submitter(name), texts.make_query, queue_manager=runtime.queue_manager)
        finally:
            await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slo", type=float, default=None, help="seconds (default 0.2 simulated, 1.0 otherwise)")
    # The profile's flags as `windve calibrate` has them, its 5 rounds a level included: the bench judges the
    # calibration users run (it had used 3; three runs did not show 5 estimate better: bench/ESTIMATOR.md,
    # 2026-12-07). A shallower cap by default here.
    add_profile_arguments(parser)
    parser.set_defaults(max_concurrency=1024)
    parser.add_argument("--misses", type=int, default=8,
                        help="the step-1 reference stops after this many levels in a row miss (default: %(default)s; "
                             "1: a plain step-1 stress test)")
    parser.add_argument("--repeats", type=int, default=1, help="estimate and step-N runs against the one reference")
    parser.add_argument("--references", type=int, default=1,
                        help="step-1 tests, spread among the repeats: more than one shows how far the reference "
                             "itself moves in one run (the table judges against the first)")
    parser.add_argument("--sections", default="methods,mixed")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--served", action="store_true", help="start `windve serve` per pool and measure over HTTP")
    where.add_argument("--in-process", action="store_true", help="profile the service runtime in this process")
    parser.add_argument("--pools", help="comma-separated pool names (default: all)")
    args = parser.parse_args()
    if args.references < 1 or args.repeats < 1:
        parser.error("--references and --repeats must be at least 1")
    real = args.served or args.in_process
    slo = args.slo or (1.0 if real else 0.2)
    sections = set(args.sections.split(","))
    if args.served and "mixed" in sections:
        print("section mixed needs the queue manager's admission: run it with --in-process")
        sections.discard("mixed")
    options = profile_options(args, TOKENS, max(30.0, 10 * slo))
    names = args.pools.split(",") if args.pools else None

    async def body(pools: AsyncIterator[Pool]) -> None:
        async for pool in pools:
            if "methods" in sections:
                await compare_methods(pool, slo, options, args.step, args.misses, args.repeats, args.references)
            if "mixed" in sections:
                await mixed_lengths(pool, slo, options)

    where_from = "served over HTTP" if args.served else "the runtime in-process" if args.in_process else "simulated"
    print(f"bench/estimator.py: {where_from} pools, p99 tails; a shared, loaded machine")
    if real:
        asyncio.run(body(service_pools(names, args.served)))
        return
    run_virtual(body(simulated_pools(names, padded=False)))
    if "mixed" in sections:
        print("\nthe same check on a FIFO batcher that pads each batch to its longest query (no length grouping):")
        sections.discard("methods")
        run_virtual(body(simulated_pools(names, padded=True)))


if __name__ == "__main__":
    main()
