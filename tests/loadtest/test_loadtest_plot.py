"""The sweep's picture from known step figures, without a server: the edge cases a live run
rarely hits (a step where every request met BUSY has no p99 at all)."""

from __future__ import annotations

from pathlib import Path

from loadtest.plot import plot_sweep
from loadtest.recorder import Tally, summarize
from loadtest.report import StepResult, SweepResult, judge
from tests.loadtest.png_check import check_png

SLO = 0.5
SETTINGS = {"host": "http://127.0.0.1:8080", "route": "/embed", "texts_per_request": 1, "query_tokens": 75,
            "slo_seconds": SLO}  # fmt: skip


def step(users: int, tally: Tally) -> StepResult:
    summary = summarize(tally, 2.0, SLO, 1)
    passed, reason = judge(summary, SLO, busy_disqualifies=True)
    return StepResult(users, users, summary, passed, reason)


def test_goodput_counts_only_answers_within_the_slo() -> None:
    summary = summarize(Tally(latencies=[0.1, 0.2, 0.9, 1.2]), 2.0, SLO, 3)
    assert summary.texts_per_second == 6.0  # 4 answers x 3 texts / 2 s
    assert summary.goodput_texts_per_second == 3.0  # the 2 answers within 0.5 s


def test_plot_draws_passing_late_and_all_busy_steps(tmp_path: Path) -> None:
    result = SweepResult(SETTINGS)
    result.steps = [
        step(1, Tally(latencies=[0.05] * 40)),
        step(4, Tally(latencies=[0.1] * 30 + [0.8] * 10)),  # p99 over the SLO
        step(16, Tally(busy=50)),  # nothing served: no p99 to draw
    ]
    assert [s.passed for s in result.steps] == [True, False, False]
    assert result.steps[2].summary.p99_ms is None
    path = tmp_path / "sweep.png"
    plot_sweep(result, path)
    check_png(path)
