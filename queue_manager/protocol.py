"""What the queue manager needs from the outside world, and what it answers.

An *instance* is "something that embeds a batch": the queue manager knows nothing about
models, devices or processes. `windve` adapts engines (in-process, one feeding thread) and
pinned CPU worker processes to this protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


class Busy(Exception):
    """Every pool that may take the request is full; nothing of it stays queued."""

    def __init__(self, retry_after: float, message: str = "all queues are full") -> None:
        super().__init__(message)
        self.retry_after = retry_after


class InstanceFailed(RuntimeError):
    """An instance could not embed a batch (it errored, or its process died)."""


class QueryFailed(RuntimeError):
    """An admitted query could not be answered by any instance of its pool."""


class ShuttingDown(Busy):
    """The service is draining: it admits nothing new."""


class Unavailable(Exception):
    """No pool that may take the request has an instance able to serve (all failed or restarting).

    Not a Busy: full queues (429, retry soon, here) and broken pools (503, maybe another replica)
    call for different answers, and a handler written for Busy must not pass this off as one.
    """

    def __init__(self, retry_after: float, message: str = "no instance can serve the request") -> None:
        super().__init__(message)
        self.retry_after = retry_after


@runtime_checkable
class Instance(Protocol):
    """One model instance. `embed` runs off the event loop; the queue manager alone calls it.

    An instance may set `pipeline = K` (an int attribute, 1 when absent) to take up to K batches
    at once: the queue manager then hands it the next batch while the current one computes, and
    the instance must answer its calls in the order they were made (engine processes do: the next
    batch waits in the engine's pipe, so the engine does not idle while the dispatcher's thread
    is busy elsewhere). With `ahead_fill = F` (a float attribute, 0 when absent) a batch is handed
    over while another computes only once F of a full batch is queued; until then the queries wait
    for the computing batch's answer and leave with whatever came meanwhile.

    An instance may also offer `submit(sequences) -> concurrent.futures.Future`, which starts the
    batch before it returns and resolves to what `embed` returns (on any thread). The queue manager
    then uses it instead of `embed`: no task stands between an answer and the next batch.
    """

    name: str

    async def start(self) -> None:
        """Load and warm up; raise on failure."""

    async def embed(self, sequences: Sequence[np.ndarray]) -> np.ndarray:
        """Token-id sequences (unpadded, int) -> float32 [len(sequences), dim], pooled.

        Raises InstanceFailed when the instance can no longer serve (e.g. its process died).
        """

    async def restart(self) -> None:
        """Bring a failed instance back; raise if it cannot be."""

    async def close(self) -> None:
        """Release processes, threads and memory; idempotent."""
