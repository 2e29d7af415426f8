"""Online depth control on a simulated pool that slows down and recovers, in virtual time.

One pool (one instance batching up to 8 queries in 0.02 + 0.01*n s) is offered 2.5x the one-query
requests it can serve; between `slow_at` and `recover_at` every batch takes twice as long. The
static depth (the calibrated one, as the paper) misses the SLO for as long as the pool is slow; the
adaptive one falls until the tail meets it, and comes back after. Exact and deterministic: the real
QueueManager runs on a virtual clock (queue_manager.simulation), a 100 s run takes well under a second.

    python bench/depth_control.py [--window 2] [--slo 1.0] [--seed-depth 56]

Other pools and slowdowns: `--per-batch`, `--per-query`, `--max-batch-size`, `--arrival-rate`,
`--slowdown`, `--slow-at`, `--recover-at`, `--end` (Scenario's fields; bench/DEPTH_CONTROL.md has
runs with a batch-bound pool and with a short stall).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from queue_manager.simulation import Record, Scenario, run_scenario, windows


def phase(scenario: Scenario, start: float) -> str:
    if start < scenario.slow_at:
        return "normal"
    return "slow" if start < scenario.recover_at else "recovered"


def table(scenario: Scenario, records: dict[str, Record], width: float) -> list[str]:
    modes = list(records)
    header = f"{'t (s)':>7} {'phase':>9} " + " ".join(
        f"| {mode:>8} depth {'p99 (s)':>8} {'accepted/s':>10}" for mode in modes
    )
    lines = [header, "-" * len(header)]
    for start, stop in windows(scenario, width):
        cells = []
        for mode in modes:
            record = records[mode]
            tail = record.p99_answered(start, stop)
            shown = "-" if tail is None else f"{tail:.3f}" + ("*" if tail > scenario.slo else " ")
            cells.append(f"| {record.depth_at(start):>14} {shown:>8} {record.accepted_rate(start, stop):>10.1f}")
        lines.append(f"{start:>7.1f} {phase(scenario, start):>9} " + " ".join(cells))
    return lines


def summary(scenario: Scenario, records: dict[str, Record]) -> list[str]:
    lines = []
    for mode, record in records.items():
        # Once the controller has had 10 s to meet the slowdown (all of it for a shorter one).
        settled = min(scenario.slow_at + 10, scenario.recover_at - 1)
        slow = [record.p99_answered(t, t + 1) for t in range(int(settled), int(scenario.recover_at))]
        worst = max((tail for tail in slow if tail is not None), default=None)
        before = record.depth_at(scenario.slow_at)
        back = next(
            (t for t in range(int(scenario.recover_at), int(scenario.end)) if record.depth_at(t) >= 0.8 * before), None
        )
        moves = sum(a != b for (_, a), (_, b) in zip(record.depths, record.depths[1:]))
        lines.append(
            f"{mode:>8}: {len(record.answers)} answered, {len(record.refused)} BUSY, {moves} depth moves; "
            f"worst 1 s p99 from {settled - scenario.slow_at:g} s into the slowdown to recovery "
            + ("-" if worst is None else f"{worst:.3f} s")
            + f" (SLO {scenario.slo:g} s); "
            f"depth back to >= 80% of {before} "
            + (f"{back - scenario.recover_at:.0f} s after recovery" if back is not None else "never")
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=2.0, help="seconds per table row")
    parser.add_argument("--slo", type=float, default=Scenario.slo)
    parser.add_argument("--seed-depth", type=int, default=Scenario.seed_depth)
    for name in ("per_batch", "per_query", "arrival_rate", "slowdown", "slow_at", "recover_at", "end"):
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(Scenario, name))
    parser.add_argument("--max-batch-size", type=int, default=Scenario.max_batch_size)
    args = parser.parse_args()
    fields = ("slo", "seed_depth", "per_batch", "per_query", "arrival_rate", "slowdown", "slow_at", "recover_at",
              "end", "max_batch_size")
    scenario = replace(Scenario(), **{name: getattr(args, name) for name in fields})
    if not 0 <= scenario.slow_at < scenario.recover_at <= scenario.end:
        parser.error("the slowdown must start before it ends, within the run (--slow-at < --recover-at <= --end)")
    records = {mode: run_scenario(scenario, mode) for mode in ("static", "adaptive")}
    print(
        f"pool: batches of <= {scenario.max_batch_size} in {scenario.per_batch} + {scenario.per_query}*n s, "
        f"x{scenario.slowdown:g} from {scenario.slow_at:g} s to {scenario.recover_at:g} s; "
        f"{scenario.arrival_rate:g} requests/s offered; seed depth {scenario.seed_depth}; SLO {scenario.slo:g} s"
    )
    print("depth at the start of each row; p99 of the answers in the row (* over the SLO)\n")
    print("\n".join(table(scenario, records, args.window)))
    print()
    print("\n".join(summary(scenario, records)))


if __name__ == "__main__":
    main()
