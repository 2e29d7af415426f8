"""Prometheus counters of the embedding cache (default registry, served by /metrics).

Every key looked up counts once: as a hit, labelled with the tier that answered it
(`local` or `redis`), or as a miss, labelled with the cache's backend. So
hits / (hits + misses) summed over labels is the hit ratio. Errors are failed Redis calls.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

HITS = Counter("windve_cache_hits_total", "Embedding cache lookups answered from the cache", ["backend"])
MISSES = Counter("windve_cache_misses_total", "Embedding cache lookups not in the cache", ["backend"])
ERRORS = Counter(
    "windve_cache_errors_total", "Failed Redis cache calls (the request went on uncached)", ["backend"]
)
_BY_KIND = {"hits": HITS, "misses": MISSES, "errors": ERRORS}
# Labelled so that it is exported only by a service whose cache has a Redis; with several front
# ends, the lowest of theirs: 0 when any of them skips Redis as down.
REDIS_UP = Gauge(
    "windve_cache_redis_up",
    "1 while the embedding cache uses its Redis, 0 while it skips it as down (requests go on uncached)",
    ["backend"],
    multiprocess_mode="livemin",
)

for _counter in _BY_KIND.values():
    for _backend in ("local", "redis"):
        _counter.labels(_backend)  # exported as 0 from the start, so rates exist before the first event


class CacheCounters:
    """One cache's own tallies (for stats()), mirrored into the process-wide Prometheus counters."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, int]] = {kind: {} for kind in _BY_KIND}

    def add(self, kind: str, backend: str, amount: int = 1) -> None:
        if amount:
            tally = self.values[kind]
            tally[backend] = tally.get(backend, 0) + amount
            _BY_KIND[kind].labels(backend).inc(amount)

    def total(self, kind: str) -> int:
        return sum(self.values[kind].values())
