"""Where a served request's time went, and how many answers missed the SLO, from the service's own
/metrics read before and after a run.

Histogram sums, counts and one bucket only, so each figure is exact over the run's answers:
- front end: a request's arrival to its hand-over to the dispatcher (reading, validating,
  tokenizing, and waiting for the front end's event loop or in the slow lane);
- queue: a query's wait in its pool before its batch started;
- batch: a batch's time from when its instance could start it to its answer, and the queries in it;
  beside it, the engine processes' own time for their batches (compute): what the batch's time has
  beyond it is the hand-over, the pipes and the dispatcher's loop, when the device idles;
- request: a 200's whole time, from its arrival (the kernel's stamp) to its answer, encoded and
  ready to write; what is left of it beyond front end + queue + batch is the hop to the
  dispatcher and back, normalizing and encoding;
- late: the requests refused for having waited in a parked connection (the slow lane) longer
  than the SLO leaves beyond the pools' live p99 (windve_late_refusals_total, windve/frontend/gate.py);
- over the SLO: the 200s slower than the SLO, read at the bucket bound that is the SLO (1 s is
  one) or the next above it. Every 200 counts, not a sample of them: the accepted p99 is within
  the SLO exactly when at most 1 % are over it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

# (metric family, the label that splits it or None): the histograms read.
HISTOGRAMS = {
    "windve_request_seconds": None,
    "windve_front_end_seconds": None,
    "windve_queue_seconds": "pool",
    "windve_inference_seconds": "pool",
    "windve_engine_compute_seconds": "pool",
    "windve_batch_size": "pool",
}
ANSWERS = "windve_request_seconds"
LATE = "windve_late_refusals"


@dataclass(frozen=True)
class Snapshot:
    sums: dict[str, tuple[float, float]]  # "family" or "family:label" -> (sum, count)
    bound: float  # the bucket bound read for the SLO (seconds): the SLO, or the next bound above it
    within: float  # 200s answered within `bound`, summed over routes
    late: float = 0.0  # requests refused as late


def snapshot(port: int, slo: float) -> Snapshot:
    """The histograms' sums and counts now, each family summed over its labels but the splitting one
    (so the answers' time adds up their routes), and the 200s within the SLO's bucket."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    sums: dict[str, list[float]] = {}
    within: dict[float, float] = {}
    late = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == LATE:
            late += sum(sample.value for sample in family.samples if sample.name == LATE + "_total")
        if family.name not in HISTOGRAMS:
            continue
        label = HISTOGRAMS[family.name]
        for sample in family.samples:
            if family.name == ANSWERS and sample.name == ANSWERS + "_bucket":
                bound = float(sample.labels["le"])
                within[bound] = within.get(bound, 0.0) + sample.value
            kind = {family.name + "_sum": 0, family.name + "_count": 1}.get(sample.name)
            if kind is None:
                continue
            key = f"{family.name}:{sample.labels[label]}" if label else family.name
            sums.setdefault(key, [0.0, 0.0])[kind] += sample.value
    bound = min((b for b in within if b >= slo), default=math.inf)
    totals = {key: (total, count) for key, (total, count) in sums.items()}
    return Snapshot(totals, bound, within.get(bound, 0.0), late)


def split(before: Snapshot, after: Snapshot) -> dict:
    """The run's means, {"family[:label]": (mean, how many)} for each histogram it added to, and
    "over_slo": (200s over the SLO's bound, 200s, the bound), "late": requests refused as late."""
    out: dict = {"late": round(after.late - before.late)}
    for key, (total, count) in after.sums.items():
        old_total, old_count = before.sums.get(key, (0.0, 0.0))
        if count > old_count:
            out[key] = ((total - old_total) / (count - old_count), round(count - old_count))
    if ANSWERS in out:
        answers = out[ANSWERS][1]
        out["over_slo"] = (round(answers - (after.within - before.within)), answers, after.bound)
    return out


def describe(means: dict) -> str:
    """One line: front end, then per pool queue, batch and batch size, then the 200s' time and how
    many were over the SLO."""

    def ms(key: str) -> str:
        return f"{1000 * means[key][0]:.1f} ms" if key in means else "-"

    parts = [f"front end {ms('windve_front_end_seconds')}"]
    pools = sorted(key.split(":", 1)[1] for key in means if key.startswith("windve_queue_seconds:"))
    for pool in pools:
        size = means.get(f"windve_batch_size:{pool}")
        queries = f", {size[0]:.1f} queries" if size else ""
        compute = f"windve_engine_compute_seconds:{pool}"
        engine = f" (engine {ms(compute)})" if compute in means else ""
        parts.append(f"{pool}: queue {ms(f'windve_queue_seconds:{pool}')}, "
                     f"batch {ms(f'windve_inference_seconds:{pool}')}{engine}{queries}")
    line = f"request {ms(ANSWERS)}"
    if "over_slo" in means:
        over, answers, bound = means["over_slo"]
        line += f"; 200s over {bound:g} s: {over} of {answers} ({100 * over / answers:.2f} %)"
    parts.append(line)
    if means.get("late"):
        parts.append(f"{means['late']} refused late")
    return "; ".join(parts)
