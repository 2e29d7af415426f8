"""Counts what the simulated users saw: served answers (with exact latencies), BUSY, errors.

It listens to Locust's `request` event, so it needs no Locust import. Locust's own stats
round response times (to 2 significant digits above 100 ms), too coarse to compare a p99
with an SLO; the recorder keeps every latency of a measurement window instead.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

BUSY_SUFFIX = " BUSY"  # request-name suffix of 429 answers: their own row in Locust's stats
MAX_ERROR_SAMPLES = 5


@dataclass
class Tally:
    """Raw outcomes of one measurement window."""

    latencies: list[float] = field(default_factory=list)  # seconds, served answers only
    busy: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    dimensions: set[int] = field(default_factory=set)


class Recorder:
    """A Locust `request` listener; `take()` hands over the current window and starts a new one."""

    def __init__(self) -> None:
        self._tally = Tally()

    def on_request(
        self,
        name: str,
        response_time: float,
        exception: BaseException | None = None,
        context: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        tally = self._tally
        if exception is not None:
            tally.errors += 1
            message = f"{name}: {exception}"
            if len(tally.error_samples) < MAX_ERROR_SAMPLES and message not in tally.error_samples:
                tally.error_samples.append(message)
        elif name.endswith(BUSY_SUFFIX):
            tally.busy += 1
        else:
            tally.latencies.append(response_time / 1000.0)
            if context and "dimension" in context:
                tally.dimensions.add(context["dimension"])

    @property
    def answered(self) -> int:
        """Answers in the current window, of any outcome."""
        tally = self._tally
        return len(tally.latencies) + tally.busy + tally.errors

    def take(self) -> Tally:
        tally, self._tally = self._tally, Tally()
        return tally

    def peek(self) -> Tally:
        """The current window so far, left running (for progress reports; do not modify it)."""
        return self._tally


@dataclass
class Summary:
    """One window's figures: throughput, BUSY share, errors, SLO misses, latency percentiles."""

    seconds: float
    requests: int  # answered in the window: served + BUSY + errors
    served: int
    busy: int
    errors: int
    busy_share: float
    slo_misses: int  # served answers slower than the SLO
    requests_per_second: float
    texts_per_second: float
    goodput_texts_per_second: float  # texts of answers served within the SLO, per second
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    dimensions: list[int]
    error_samples: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(tally: Tally, seconds: float, slo_seconds: float, texts_per_request: int) -> Summary:
    latencies = sorted(tally.latencies)
    served = len(latencies)
    slo_misses = sum(1 for t in latencies if t > slo_seconds)
    requests = served + tally.busy + tally.errors
    seconds = max(seconds, 1e-9)

    def ms(q: float) -> float | None:
        return round(percentile(latencies, q) * 1000.0, 2) if latencies else None

    return Summary(
        seconds=round(seconds, 3),
        requests=requests,
        served=served,
        busy=tally.busy,
        errors=tally.errors,
        busy_share=round(tally.busy / requests, 4) if requests else 0.0,
        slo_misses=slo_misses,
        requests_per_second=round(served / seconds, 2),
        texts_per_second=round(served * texts_per_request / seconds, 2),
        goodput_texts_per_second=round((served - slo_misses) * texts_per_request / seconds, 2),
        p50_ms=ms(0.50),
        p90_ms=ms(0.90),
        p99_ms=ms(0.99),
        max_ms=ms(1.0),
        dimensions=sorted(tally.dimensions),
        error_samples=list(tally.error_samples),
    )


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least q of the values at or below it."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]
