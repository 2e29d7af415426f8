"""Where a served request's time went, from the service's own /metrics read before and after a run.

Histogram sums and counts only, so each figure is an exact mean over the run's answers:
- front end: a request's arrival to its hand-over to the dispatcher (reading, validating,
  tokenizing, and waiting for the front end's event loop or in the slow lane);
- queue: a query's wait in its pool before its batch started;
- batch: a batch's time from when its instance could start it to its answer, and the queries in it;
- request: the whole of it, from arrival (every embedding answer, refusals included).

What is left of a request's time beyond front end + queue + batch is the hop to the dispatcher and
back, and writing the answer.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

# (metric family, the label that splits it or None): the histograms read.
HISTOGRAMS = {
    "windve_request_seconds": None,
    "windve_front_end_seconds": None,
    "windve_queue_seconds": "pool",
    "windve_inference_seconds": "pool",
    "windve_batch_size": "pool",
}

Sums = dict[tuple[str, str], tuple[float, float]]  # (family, label value or "") -> (sum, count)


def snapshot(port: int) -> Sums:
    """The histograms' sums and counts now; each family's label values are summed over but the
    splitting label (so the request time adds up its routes)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    sums: dict[tuple[str, str], list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in HISTOGRAMS:
            continue
        label = HISTOGRAMS[family.name]
        for sample in family.samples:
            kind = {family.name + "_sum": 0, family.name + "_count": 1}.get(sample.name)
            if kind is None:
                continue
            key = (family.name, sample.labels.get(label, "") if label else "")
            sums.setdefault(key, [0.0, 0.0])[kind] += sample.value
    return {key: (total, count) for key, (total, count) in sums.items()}


def means(before: Sums, after: Sums) -> dict[str, tuple[float, int]]:
    """"family" or "family:label" -> (the mean over what the run added, how many it added); a
    histogram the run added nothing to is left out."""
    out = {}
    for (family, label), (total, count) in after.items():
        old_total, old_count = before.get((family, label), (0.0, 0.0))
        added = count - old_count
        if added > 0:
            out[f"{family}:{label}" if label else family] = ((total - old_total) / added, round(added))
    return out


def describe(split: dict[str, tuple[float, int]]) -> str:
    """One line: front end, then per pool queue, batch and batch size, then the whole request."""

    def ms(key: str) -> str:
        return f"{1000 * split[key][0]:.1f} ms" if key in split else "-"

    parts = [f"front end {ms('windve_front_end_seconds')}"]
    pools = sorted(key.split(":", 1)[1] for key in split if key.startswith("windve_queue_seconds:"))
    for pool in pools:
        size = split.get(f"windve_batch_size:{pool}")
        queries = f", {size[0]:.1f} queries" if size else ""
        parts.append(f"{pool}: queue {ms(f'windve_queue_seconds:{pool}')}, "
                     f"batch {ms(f'windve_inference_seconds:{pool}')}{queries}")
    parts.append(f"request {ms('windve_request_seconds')} (refusals included)")
    return "; ".join(parts)
