"""/metrics of a front end: its own metrics (added up over every front-end process when there
are several) and the dispatcher's (pools, batches, engine processes)."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families


def combined_metrics(dispatcher_text: bytes) -> bytes:
    """The exposition text; a family the dispatcher reports is not repeated from the front ends."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:  # one process: the dispatcher's metrics are in this registry already
        return generate_latest() + dispatcher_text
    taken = {family.name for family in text_string_to_metric_families(dispatcher_text.decode())}
    registry = CollectorRegistry()
    registry.register(_FrontEnds(directory, taken))
    return generate_latest(registry) + dispatcher_text


class _FrontEnds:
    def __init__(self, directory: str, taken: set[str]) -> None:
        self._collector = MultiProcessCollector(None, directory)
        self._taken = taken

    def collect(self):
        return (family for family in self._collector.collect() if family.name not in self._taken)
