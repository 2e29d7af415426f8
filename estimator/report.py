"""The calibration as text: a table like the paper's Table III (depth and time per method), then fits and notes."""

from __future__ import annotations

from collections.abc import Sequence

from estimator.calibration import Calibration
from estimator.fit import LengthFit


def _depth(value: int | None, ran: bool) -> str:
    if not ran:
        return "-"
    return "unusable" if value is None or value == 0 else str(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        # SLO and pool name left-aligned, numbers right-aligned.
        return "  ".join(
            cell.ljust(width) if i < 2 else cell.rjust(width) for i, (cell, width) in enumerate(zip(cells, widths))
        )

    return [line(header), "  ".join("-" * width for width in widths), *(line(row) for row in rows)]


def format_report(calibration: Calibration) -> str:
    """Depth per pool and SLO by each method with the wall time it took, then the fits."""
    any_stress = any(pool.stress is not None for pool in calibration.pools.values())
    step = next((pool.stress.step for pool in calibration.pools.values() if pool.stress), None)
    stress_title = f"stress test (step {step})" if any_stress else "stress test"
    header = ["SLO (s)", "pool", "estimate", "time (s)", stress_title, "time (s)"]
    rows = []
    for slo in calibration.slos:
        for name, pool in calibration.pools.items():
            entry = pool.at(slo)
            rows.append(
                [
                    f"{slo:g}",
                    name,
                    _depth(entry.estimate, True),
                    _seconds(pool.profile_seconds),
                    _depth(entry.stress_test, pool.stress is not None),
                    _seconds(pool.stress.seconds if pool.stress else None),
                ]
            )
    aim = f", aiming at {1 - calibration.headroom:.0%} of the SLO" if calibration.headroom else ""
    lines = [
        f"Queue depths (p99 of queries of {calibration.query_tokens} tokens, {calibration.rounds} rounds per level"
        f"{aim}) for {calibration.model.name} on {calibration.hardware_fingerprint}",
        *_table(header, rows),
        "",
        "Fits (p99 latency t in seconds, C queries in flight):",
    ]
    for name, pool in calibration.pools.items():
        fit = pool.fit
        lines.append(
            f"  {name}: t = {fit.alpha:.5g}*C + {fit.beta:.5g}  "
            f"(R^2 = {fit.r2:.4f}, {fit.points} levels; stopped: {pool.profile_stop})"
        )
        if pool.length_fit is not None:
            lf = pool.length_fit
            budgets = ", ".join(
                f"{entry.token_budget} tokens at {entry.slo:g} s" for entry in pool.depths if entry.token_budget
            )
            lines.append(
                f"  {name} by length: t = C*({lf.per_token:.4g}*L + {lf.per_token_squared:.4g}*L^2 + "
                f"{lf.per_query:.4g}) + {lf.constant:.4g}  "
                f"(R^2 = {lf.r2:.4f}, L = {lf.min_length}..{lf.max_length}, {pool.length_seconds:.1f} s); "
                f"token budget: {budgets or 'none'} ({describe_charge(lf)})"
            )
        refused = next((s for s in reversed(pool.samples) if s.failures), None)
        if refused is not None:
            lines.append(
                f"  {name}: {refused.failures} of {refused.concurrency * refused.rounds} requests at "
                f"C={refused.concurrency} failed ({refused.first_error}); the fit uses the levels that were "
                "answered. A server refuses what its queues cannot hold: while calibrating it by --url, "
                "give it deeper queues and static depth control (e.g. WINDVE_CPU_DEPTH=100000 "
                "WINDVE_DEPTH_CONTROL=static)."
            )
        if pool.recheck is not None:
            lines.append(f"  {name} recheck: {pool.recheck.describe()}")
        moved = calibration.crossing_moved(name)
        if moved is not None:
            lines.append(f"  {name}: {moved.describe()}")
        for entry in pool.depths:
            if entry.estimate is None or entry.bounded:
                lines.append(f"  {name} at {entry.slo:g} s: {entry.reason}")
            elif entry.capped:
                lines.append(
                    f"  {name} at {entry.slo:g} s: {entry.reason}: the pool may hold the SLO deeper than was "
                    "measured; calibrate with a larger --max-concurrency to find out"
                )
    if calibration.cpu_layout is not None:
        trials = ", ".join(
            f"{t.name}: {t.depth if t.depth is not None else ('error' if t.error else 'unusable')} ({t.seconds:.1f} s)"
            for t in calibration.cpu_layout.trials
        )
        lines.append(f"CPU layout: chose {calibration.cpu_layout.chosen or 'none'} (depth per layout: {trials})")
    return "\n".join(lines)


def describe_charge(fit: LengthFit) -> str:
    """How admission charges a query against the token budget, with an example length."""
    if fit.per_token <= 0:
        return "length does not matter: admit by query depth"
    ratio = fit.squared_token_ratio or 0.0
    return (
        f"each query charged L + {ratio:.3g}*L^2 + {fit.per_query_tokens} tokens, "
        f"e.g. {fit.charge(fit.max_length)} for L = {fit.max_length}"
    )
