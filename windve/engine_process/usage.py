"""CPU seconds and resident memory of every engine process, read from /proc at scrape time."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")

EngineProcesses = Callable[[], Iterable[tuple[str, int, int]]]  # () -> (engine name, rank, pid)


def process_usage(pid: int) -> tuple[int, float] | None:
    """(resident bytes, user + system CPU seconds) of a live process, else None."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            resident = int(statm.read().split()[1]) * _PAGE
        with open(f"/proc/{pid}/stat") as stat:
            # Fields after the parenthesised command name: utime and stime are the 12th and 13th.
            fields = stat.read().rsplit(")", 1)[1].split()
        return resident, (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


class EngineUsageCollector:
    """windve_engine_rss_bytes and windve_engine_cpu_seconds_total per engine (instance name) and rank.

    One collector per process, over every runtime that registered its engines (calibration runs
    several at once). The label is `engine`, not `instance`: Prometheus keeps `instance` for the
    scraped target."""

    def __init__(self) -> None:
        self.sources: dict[int, EngineProcesses] = {}

    def collect(self) -> Iterator[Metric]:
        rss = GaugeMetricFamily(
            "windve_engine_rss_bytes", "Resident memory of an engine process", labels=["engine", "rank"]
        )
        cpu = CounterMetricFamily(
            "windve_engine_cpu_seconds", "CPU time of an engine process", labels=["engine", "rank"]
        )
        for source in list(self.sources.values()):
            for name, rank, pid in source():
                usage = process_usage(pid)
                if usage is not None:
                    rss.add_metric([name, str(rank)], usage[0])
                    cpu.add_metric([name, str(rank)], usage[1])
        yield rss
        yield cpu


_COLLECTOR: EngineUsageCollector | None = None


def watch_engines(owner: object, processes: EngineProcesses) -> None:
    """Export `processes`' usage until `forget_engines(owner)`."""
    global _COLLECTOR
    if _COLLECTOR is None:
        _COLLECTOR = EngineUsageCollector()
        REGISTRY.register(_COLLECTOR)
    _COLLECTOR.sources[id(owner)] = processes


def forget_engines(owner: object) -> None:
    if _COLLECTOR is not None:
        _COLLECTOR.sources.pop(id(owner), None)
