"""Online depth control on a simulated pool that slows down and recovers, in virtual time.

One pool (one instance batching up to 8 queries in 0.02 + 0.01*n s) is offered 2.5x the one-query
requests it can serve; between `slow_at` and `recover_at` every batch takes twice as long. The
static depth (the calibrated one, as the paper) misses the SLO for as long as the pool is slow; the
adaptive one falls until the tail meets it, and comes back after. Exact and deterministic: the real
QueueManager runs on a virtual clock (queue_manager.simulation), a 100 s run takes well under a second.

    python bench/depth_control.py [--window 2] [--slo 1.0] [--seed-depth 56]
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
        slow = [record.p99_answered(t, t + 1) for t in range(int(scenario.slow_at) + 10, int(scenario.recover_at))]
        before = record.depth_at(scenario.slow_at)
        back = next(
            (t for t in range(int(scenario.recover_at), int(scenario.end)) if record.depth_at(t) >= 0.8 * before), None
        )
        moves = sum(a != b for (_, a), (_, b) in zip(record.depths, record.depths[1:]))
        lines.append(
            f"{mode:>8}: {len(record.answers)} answered, {len(record.refused)} BUSY, {moves} depth moves; "
            f"worst 1 s p99 from slowdown+10 s to recovery {max(slow):.3f} s (SLO {scenario.slo:g} s); "
            f"depth back to >= 80% of {before} "
            + (f"{back - scenario.recover_at:.0f} s after recovery" if back is not None else "never")
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=2.0, help="seconds per table row")
    parser.add_argument("--slo", type=float, default=Scenario.slo)
    parser.add_argument("--seed-depth", type=int, default=Scenario.seed_depth)
    args = parser.parse_args()
    scenario = replace(Scenario(), slo=args.slo, seed_depth=args.seed_depth)
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
