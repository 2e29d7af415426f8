"""An engine in the service process, fed by one thread: how accelerator instances run.

The feeding thread keeps padding, host->device copies and the forward pass off the event
loop; torch releases the GIL inside its kernels, so the loop keeps answering HTTP. The
feeding thread is pinned to the instance's cores (Linux applies sched_setaffinity(0) to the
calling thread only, and the threads it starts inherit it), so an accelerator's host path
stays on its reserved cores.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from queue_manager.protocol import InstanceFailed
from windve.engines import Engine, pad_batch

WARMUP_SEQUENCE = np.array([101] + [1037] * 14 + [102], dtype=np.int32)


class EngineInstance:
    """Adapts an Engine to the queue manager's Instance protocol."""

    def __init__(
        self, name: str, make_engine: Callable[[], Engine], pad_id: int = 0, cores: Sequence[int] = ()
    ) -> None:
        self.name = name
        self._make_engine = make_engine
        self._pad_id = pad_id
        self.cores = tuple(cores)
        self._engine: Engine | None = None
        self._executor: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"feed-{self.name}", initializer=self._pin_feeding_thread
        )
        loop = asyncio.get_running_loop()
        self._engine = await loop.run_in_executor(self._executor, self._make_engine)
        await self.embed([WARMUP_SEQUENCE] * 2)

    def _pin_feeding_thread(self) -> None:
        if self.cores:
            os.sched_setaffinity(0, self.cores)
        self.feeding_thread_affinity = sorted(os.sched_getaffinity(0))

    def _embed_now(self, sequences: Sequence[np.ndarray]) -> np.ndarray:
        input_ids, attention_mask = pad_batch(sequences, self._pad_id)
        return self._engine.embed(input_ids, attention_mask)

    async def embed(self, sequences: Sequence[np.ndarray]) -> np.ndarray:
        if self._engine is None or self._executor is None:
            raise InstanceFailed(f"instance {self.name} is not running")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._embed_now, sequences)
        except (RuntimeError, MemoryError) as error:  # device errors surface as RuntimeError
            raise InstanceFailed(f"instance {self.name}: {error}") from error

    async def restart(self) -> None:
        await self.close()
        await self.start()

    async def close(self) -> None:
        executor, self._executor, self._engine = self._executor, None, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def info(self) -> dict:
        engine = self._engine
        return {
            "kind": "in-process",
            "cores": list(self.cores),
            "feeding_thread_affinity": getattr(self, "feeding_thread_affinity", None),
            "device": getattr(engine, "device", None),
            "dtype": getattr(engine, "dtype", None),
            "engine": type(engine).__name__ if engine else None,
        }
