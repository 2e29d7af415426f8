"""Sweep verdicts and output: which steps served within the SLO, the table and the JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadtest.recorder import Summary


@dataclass
class StepResult:
    users: int
    queries_in_flight: int  # users x texts per request: the paper's concurrency
    summary: Summary
    passed: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "users": self.users,
            "queries_in_flight": self.queries_in_flight,
            "passed": self.passed,
            "reason": self.reason,
        } | self.summary.to_dict()


def judge(summary: Summary, slo_seconds: float, busy_disqualifies: bool) -> tuple[bool, str]:
    """A step passes when every request was served, none failed, and p99 <= SLO."""
    reasons = []
    if summary.errors:
        reasons.append(f"{summary.errors} errors")
    if summary.busy and busy_disqualifies:
        reasons.append(f"BUSY {summary.busy_share:.1%}")
    if summary.served == 0:
        reasons.append("no answer served in the step")
    elif summary.p99_ms is not None and summary.p99_ms > slo_seconds * 1000.0:
        reasons.append(f"p99 {summary.p99_ms / 1000.0:.3f} s > SLO {slo_seconds:g} s")
    return (not reasons, "; ".join(reasons) or "within SLO")


@dataclass
class SweepResult:
    settings: dict[str, Any]
    steps: list[StepResult] = field(default_factory=list)
    stopped_early: bool = False
    interrupted: bool = False  # Ctrl-C: the steps measured until then

    @property
    def best(self) -> StepResult | None:
        """The passing step with the most users: the max concurrency within the SLO."""
        passing = [step for step in self.steps if step.passed]
        return max(passing, key=lambda step: step.users) if passing else None

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "settings": self.settings,
            "steps": [step.to_dict() for step in self.steps],
            "stopped_early": self.stopped_early,
            "interrupted": self.interrupted,
            "max_users": best.users if best else None,
            "max_queries_in_flight": best.queries_in_flight if best else None,
            "max_texts_per_second": best.summary.texts_per_second if best else None,
        }


_COLUMNS = (
    # header, width, value of a step
    ("users", 5, lambda s: s.users),
    ("queries", 7, lambda s: s.queries_in_flight),
    ("req/s", 8, lambda s: f"{s.summary.requests_per_second:.1f}"),
    ("texts/s", 8, lambda s: f"{s.summary.texts_per_second:.1f}"),
    ("goodput", 8, lambda s: f"{s.summary.goodput_texts_per_second:.1f}"),
    ("p50 ms", 8, lambda s: _ms(s.summary.p50_ms)),
    ("p90 ms", 8, lambda s: _ms(s.summary.p90_ms)),
    ("p99 ms", 8, lambda s: _ms(s.summary.p99_ms)),
    (">SLO", 5, lambda s: s.summary.slo_misses),
    ("BUSY", 6, lambda s: f"{s.summary.busy_share:.1%}"),
    ("errors", 6, lambda s: s.summary.errors),
    ("served", 7, lambda s: s.summary.served),
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def table_header() -> str:
    return "  ".join(f"{name:>{width}}" for name, width, _ in _COLUMNS) + "  verdict"


def table_row(step: StepResult) -> str:
    cells = "  ".join(f"{str(value(step)):>{width}}" for _, width, value in _COLUMNS)
    return f"{cells}  {'pass' if step.passed else 'FAIL'}: {step.reason}"


def progress_line(users: int, phase: str, elapsed: float, planned: float, summary: Summary | None) -> str:
    """One line while a step runs: where it stands and, when measuring, what it has counted so far."""
    line = f"  users {users}: {phase} {elapsed:.0f}/{planned:g} s"
    if summary is None:
        return line
    return (
        f"{line}: {summary.served} served, {summary.busy} BUSY, {summary.errors} errors, "
        f"p99 {_ms(summary.p99_ms)} ms, {summary.goodput_texts_per_second:.1f} texts/s within SLO"
    )


def conclusion(result: SweepResult) -> str:
    slo = result.settings["slo_seconds"]
    best = result.best
    until = f" (interrupted: of the {len(result.steps)} step(s) measured)" if result.interrupted else ""
    if best is None:
        return f"max concurrency within the {slo:g} s SLO: none (no step passed){until}"
    return (
        f"max concurrency within the {slo:g} s SLO: {best.users} users = {best.queries_in_flight} queries in flight "
        f"({best.summary.texts_per_second:.1f} texts/s, p99 {_ms(best.summary.p99_ms)} ms){until}"
    )


def render_table(result: SweepResult) -> str:
    lines = [table_header(), *(table_row(step) for step in result.steps), conclusion(result)]
    return "\n".join(lines) + "\n"
