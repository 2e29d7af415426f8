"""The calibration picture (like the paper's Fig. 4): measured p99 latency against
concurrency, the fitted line, each SLO as a horizontal line and its depth as a vertical one.

Drawn on a bare matplotlib Figure with the Agg canvas: no pyplot global state, no display.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from estimator.calibration import Calibration, PoolCalibration

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_SLO_COLORS = ("tab:red", "tab:purple", "tab:brown", "tab:olive")


def _finite(values: list[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    return np.where(np.isfinite(array), array, np.nan)


def _draw_pool(axes: Axes, name: str, pool: PoolCalibration, query_tokens: int) -> None:
    concurrency = [s.concurrency for s in pool.samples]
    worst = _finite([s.max for s in pool.samples])
    axes.scatter(concurrency, _finite([s.p99 for s in pool.samples]), color="tab:blue", label="p99", zorder=3)
    axes.scatter(concurrency, worst, facecolors="none", edgecolors="tab:blue", label="max", zorder=3)
    if pool.stress is not None:
        axes.scatter(
            [s.concurrency for s in pool.stress.samples],
            _finite([s.p99 for s in pool.stress.samples]),
            marker="x",
            color="tab:gray",
            label=f"p99 (stress test, step {pool.stress.step})",
            zorder=2,
        )
    depths = [entry.estimate for entry in pool.depths if entry.estimate]
    right = max(concurrency + depths) * 1.1
    line = np.linspace(0, right, 200)
    fit = pool.fit
    label = f"fit {fit.alpha:.3g}·C + {fit.beta:.3g} (R²={fit.r2:.3f})"
    axes.plot(line, fit.alpha * line + fit.beta, color="tab:green", label=label)
    for index, entry in enumerate(pool.depths):
        color = _SLO_COLORS[index % len(_SLO_COLORS)]
        axes.axhline(entry.slo, color=color, linestyle="--", linewidth=1, label=f"SLO {entry.slo:g} s")
        if entry.estimate:
            label = f"C_max = {entry.estimate}"
            axes.axvline(entry.estimate, color=color, linestyle=":", linewidth=1.5, label=label)
    axes.set_title(f"{name}: {query_tokens}-token queries")
    axes.set_xlabel("concurrency C (queries in flight)")
    axes.set_ylabel("p99 latency (s)")
    axes.set_xlim(0, right)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")


def _draw_lengths(axes: Axes, name: str, pool: PoolCalibration) -> None:
    """Latency against charged tokens in flight, C*charge(L): every length falls on one line."""
    fit = pool.length_fit
    assert fit is not None
    samples = list(pool.samples) + list(pool.length_samples)
    if fit.per_token <= 0:
        axes.set_title(f"{name}: latency does not grow with length")
        axes.set_axis_off()
        return
    right = max(s.concurrency * fit.charge(s.tokens) for s in samples) * 1.1
    for index, length in enumerate(sorted({s.tokens for s in samples})):
        mine = [s for s in samples if s.tokens == length]
        charged = [s.concurrency * fit.charge(length) for s in mine]
        axes.scatter(charged, _finite([s.p99 for s in mine]), color=f"C{index}", label=f"L = {length}", zorder=3)
    line = np.linspace(0, right, 100)
    label = f"fit {fit.per_token:.3g}·charged + {fit.constant:.3g} (R²={fit.r2:.3f})"
    axes.plot(line, fit.per_token * line + fit.constant, color="tab:green", label=label)
    for entry in pool.depths:
        axes.axhline(entry.slo, color="tab:red", linestyle="--", linewidth=1)
        if entry.token_budget:
            label = f"budget {entry.token_budget} tokens @ {entry.slo:g} s"
            axes.axvline(entry.token_budget, color="tab:red", linestyle=":", label=label)
    measured = _finite([s.p99 for s in samples])
    top = max(max(entry.slo for entry in pool.depths) * 1.5, float(np.nanmax(measured)) * 1.1)
    axes.set_title(f"{name}: length-aware fit")
    ratio = fit.squared_token_ratio or 0.0
    axes.set_xlabel(f"charged tokens in flight: C × (L + {ratio:.3g}·L² + {fit.per_query_tokens})")
    axes.set_ylabel("p99 latency (s)")
    axes.set_xlim(0, right)
    axes.set_ylim(0, top)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")


def plot_calibration(calibration: Calibration, path: Path | str) -> Path:
    """Write a PNG: one panel per pool, plus a length-aware panel where a length sweep ran."""
    pools = list(calibration.pools.items())
    with_lengths = any(pool.length_fit is not None for _, pool in pools)
    rows = 2 if with_lengths else 1
    figure = Figure(figsize=(6 * len(pools), 4.5 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.subplots(rows, len(pools), squeeze=False)
    for column, (name, pool) in enumerate(pools):
        _draw_pool(grid[0][column], name, pool, calibration.query_tokens)
        if with_lengths:
            if pool.length_fit is not None:
                _draw_lengths(grid[1][column], name, pool)
            else:
                grid[1][column].set_axis_off()
    figure.suptitle(f"WindVE calibration\n{calibration.model.name}, {calibration.created}", fontsize="medium")
    path = Path(path)
    figure.savefig(path, format="png", dpi=100)
    return path
