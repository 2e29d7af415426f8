"""The sweep's picture: p99 latency and goodput against the number of closed-loop clients,
with the SLO as a horizontal line and each step marked pass or fail.

Drawn on a bare matplotlib Figure with the Agg canvas (as estimator/plot.py): no pyplot
global state, no display, so it runs headless in a container or CI.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from loadtest.report import SweepResult

FIGSIZE_INCHES = (8.0, 7.0)
DPI = 100  # 800 x 700 pixels


def plot_sweep(result: SweepResult, path: Path) -> None:
    """Write the sweep's PNG to `path`."""
    settings = result.settings
    slo = settings["slo_seconds"]
    steps = result.steps
    users = [step.users for step in steps]
    p99 = [math.nan if step.summary.p99_ms is None else step.summary.p99_ms / 1000.0 for step in steps]

    figure = Figure(figsize=FIGSIZE_INCHES, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    latency, goodput = figure.subplots(2, 1, sharex=True)

    latency.plot(users, p99, color="tab:blue", marker="o", label="p99 latency")
    passed = [(u, p) for u, p, step in zip(users, p99, steps) if step.passed]
    failed = [(u, p if not math.isnan(p) else slo) for u, p, step in zip(users, p99, steps) if not step.passed]
    if passed:
        latency.scatter(*zip(*passed), color="tab:green", zorder=3, label="step passed")
    if failed:
        latency.scatter(*zip(*failed), color="tab:red", marker="x", s=60, zorder=3, label="step failed")
    latency.axhline(slo, color="tab:red", linestyle="--", linewidth=1, label=f"SLO {slo:g} s")
    latency.set_ylabel("p99 latency (s)")
    # Headroom above the highest point and the SLO line for the legend.
    latency.set_ylim(0, 1.35 * max([slo, *(p for p in p99 if not math.isnan(p))]))

    goodput.plot(
        users, [step.summary.goodput_texts_per_second for step in steps],
        color="tab:green", marker="o", label="goodput (texts/s served within the SLO)",
    )  # fmt: skip
    goodput.plot(
        users, [step.summary.texts_per_second for step in steps],
        color="tab:gray", linestyle=":", marker=".", label="throughput (texts/s served)",
    )  # fmt: skip
    goodput.set_ylabel("texts per second")
    goodput.set_ylim(0, 1.35 * max([1.0, *(step.summary.texts_per_second for step in steps)]))
    # BUSY answers are what usually ends a WindVE sweep (full queues answer 429, not late).
    busy = goodput.twinx()
    busy.plot(
        users, [100.0 * step.summary.busy_share for step in steps],
        color="tab:red", linestyle="--", marker="x", label="BUSY share (%)",
    )  # fmt: skip
    busy.set_ylabel("BUSY share (%)")
    busy.set_ylim(0, 100)
    busy.legend(loc="lower right", fontsize="small")
    goodput.set_xlabel("clients (closed-loop users)")

    best = result.best
    for axes in (latency, goodput):
        if best is not None:
            axes.axvline(best.users, color="tab:green", linestyle=":", linewidth=1)
        axes.grid(True, alpha=0.3)
        axes.legend(loc="upper left", fontsize="small")
    if len(users) > 1 and users[-1] / users[0] >= 8:
        goodput.set_xscale("log", base=2)  # ladders like 1, 2, 4 ... 64 read evenly
    goodput.set_xticks(users, [str(count) for count in users])

    found = f"max {best.users} clients within the SLO" if best else "no step within the SLO"
    figure.suptitle(
        f"{settings['host']}{settings['route']}: {settings['texts_per_request']} text(s) x "
        f"{settings['query_tokens']} tokens per request; {found}",
        fontsize="medium",
    )
    figure.savefig(path, format="png")
