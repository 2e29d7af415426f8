"""The FastAPI application: routes, error shapes, and the runtime's lifecycle."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

import windve
from queue_manager.protocol import ShuttingDown
from windve.cache import create_cache
from windve.frontend.context import FrontEnd, start_local_front_end
from windve.frontend.fallbacks import install_fallbacks
from windve.frontend.pipeline import EmbeddingPipeline
from windve.frontend.priority import loop_niceness, lower_this_thread
from windve.frontend.routes import router
from windve.frontend.tokenize_limits import BUDGET_REQUESTS, TokenBudget
from windve.gc_tuning import tune_gc_for_serving
from windve.heartbeat import LoopBeat
from windve.malloc_tuning import return_large_buffers
from windve.probe import Listening
from windve.settings import Settings

log = logging.getLogger(__name__)

RuntimeFactory = Callable[[Settings], Awaitable[FrontEnd]]


def create_app(
    settings: Settings,
    start_runtime: RuntimeFactory = start_local_front_end,
    on_fatal: Callable[[str], None] | None = None,
    listening: Listening | None = None,
    heartbeat_fd: int | None = None,
) -> FastAPI:
    """The app answers at once (/health 503) and loads the model in the background.

    `on_fatal(message)` is called when the runtime cannot start, so the server can exit.
    `listening` says where the server that serves this app listens, once it does: the warm-up
    probe of a runtime in this process goes there over HTTP (None: it probes in-process).
    `heartbeat_fd`: a heartbeat board of the parent's (windve.heartbeat), stamped from this
    server's event loop while it serves.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        beat = LoopBeat(heartbeat_fd) if heartbeat_fd is not None else None
        if beat is not None and hasattr(asyncio.get_running_loop(), "beat"):
            asyncio.get_running_loop().beat = beat  # the HTTP protocol's reads count as progress
        task = asyncio.create_task(_start(app, settings, start_runtime, on_fatal, listening))
        try:
            yield
        finally:
            if beat is not None:
                beat.stop()
            task.cancel()
            runtime = app.state.runtime
            if runtime is not None:
                await runtime.close()
            if app.state.pipeline is not None and app.state.pipeline.cache is not None:
                await app.state.pipeline.cache.close()

    app = FastAPI(
        title="WindVE",
        version=windve.__version__,
        description=(
            "Text embeddings on every processor of the server: accelerator first, CPU overflow, BUSY when full."
        ),
        lifespan=lifespan,
        # TEI answers /embed/ with a 404; a bodiless 307 is no error a client can read.
        redirect_slashes=False,
    )
    app.state.settings = settings
    app.state.runtime = None
    app.state.pipeline = None
    app.state.startup_error = None
    app.state.ready_since = None
    app.state.tokenize_budget = TokenBudget(BUDGET_REQUESTS * settings.max_tokenize_tokens)
    app.include_router(router)
    install_fallbacks(app)
    return app


async def _start(
    app: FastAPI, settings: Settings, start_runtime: RuntimeFactory, on_fatal: Callable[[str], None] | None,
    listening: Listening | None,
) -> None:
    try:
        runtime = await start_runtime(settings)
        app.state.runtime = runtime
        app.state.ready_since = int(time.time())
        app.state.pipeline = EmbeddingPipeline(runtime, cache=create_cache(settings, dimension=runtime.spec.dim))
        tune_gc_for_serving()
        return_large_buffers()
        # After the engines started: their processes were spawned by threads that keep their priority.
        lower_this_thread(loop_niceness(settings.frontend_nice))
        # The front end serves now (/health says so once the dispatcher is ready): the warm-up
        # probe, in this process or the dispatcher's, may time its rounds through it.
        address = await listening.wait() if listening is not None else None
        await runtime.dispatcher.serving(address)
    except asyncio.CancelledError:
        raise
    except ShuttingDown:
        # SIGTERM came during the warm-up probe, whose requests the drain then refused: a stop, not
        # a failed start (which had exited 1, "could not start", and a pod deleted then ended as Error).
        log.info("stopped before it was ready")
        return
    except Exception as error:  # noqa: BLE001 - reported through /health and the exit path
        log.exception("the service could not start")
        app.state.startup_error = f"{type(error).__name__}: {error}"
        if on_fatal is not None:
            on_fatal(app.state.startup_error)
        return
    log.info("front end ready: %s", runtime.spec.name)

