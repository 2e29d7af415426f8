"""TEI's timing headers on an embedding answer: scripts written against TEI read them to split a
request's latency (x-total-time, x-tokenization-time, x-queue-time, x-inference-time), and a
missing one is a KeyError there. Milliseconds, whole, as TEI writes them."""

from __future__ import annotations

import time

from windve.frontend.pipeline import Embedded


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))


def timing_headers(embedded: Embedded, arrived: float, characters: int) -> dict[str, str]:
    """The headers of an answer to a request whose bytes arrived at `arrived` (perf_counter) with
    `characters` characters of input. Total time counts from the arrival, reading and parsing the
    body included, where TEI counts from its handler's start."""
    total = _ms(time.perf_counter() - arrived)
    return {
        "x-compute-type": embedded.served,
        "x-compute-time": total,
        "x-compute-characters": str(characters),
        "x-compute-tokens": str(embedded.tokens),
        "x-total-time": total,
        "x-tokenization-time": _ms(embedded.tokenizing),
        "x-queue-time": _ms(embedded.queued),
        "x-inference-time": _ms(embedded.computed),
    }
