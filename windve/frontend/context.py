"""What a front-end process serves with: the model's description, its own tokenizer, and a
client of the dispatcher (in this process, or in the `windve serve` parent)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from windve.dispatcher.client import LocalDispatcher, RemoteDispatcher
from windve.engines import resolve_dtype
from windve.model import ModelSpec
from windve.settings import Settings
from windve.tokenizer import TextTokenizer


@dataclass
class FrontEnd:
    settings: Settings
    spec: ModelSpec
    tokenizer: TextTokenizer
    dispatcher: LocalDispatcher | RemoteDispatcher
    dtype: str

    @property
    def ready(self) -> bool:
        return self.dispatcher.status()["status"] in ("ok", "degraded")

    async def close(self) -> None:
        await self.dispatcher.close()


async def start_local_front_end(settings: Settings) -> FrontEnd:
    """One front end with the dispatcher and its engines' owner in this same process.

    Its runtime accepts queries but is not ready until the warm-up probe has run through this
    front end (`LocalDispatcher.serving`)."""
    from windve.service import Runtime

    runtime = await Runtime.start(settings, probe_later=True)
    return FrontEnd(settings, runtime.spec, runtime.tokenizer, LocalDispatcher(runtime), runtime.dtype)


def remote_front_end_factory(
    address: str, board: Path, spec: ModelSpec
) -> Callable[[Settings], Awaitable[FrontEnd]]:
    """A factory for front ends of a dispatcher in another process, which read `spec`."""

    async def start(settings: Settings) -> FrontEnd:
        dispatcher = RemoteDispatcher(address, board)
        dispatcher.start()
        dtype = resolve_dtype(settings.dtype, "cpu", settings.engine)
        return FrontEnd(settings, spec, TextTokenizer(spec, settings.max_input_tokens), dispatcher, dtype)

    return start
