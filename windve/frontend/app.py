"""The FastAPI application: routes, error shapes, and the runtime's lifecycle."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.requests import Request

import windve
from windve.cache import create_cache
from windve.frontend.errors import VALIDATION, ApiError
from windve.frontend.pipeline import EmbeddingPipeline
from windve.frontend.routes import router
from windve.gc_tuning import tune_gc_for_serving
from windve.service import Runtime
from windve.settings import Settings

log = logging.getLogger(__name__)

RuntimeFactory = Callable[[Settings], Awaitable[Runtime]]


def create_app(settings: Settings, start_runtime: RuntimeFactory = Runtime.start, on_fatal=None) -> FastAPI:
    """The app answers at once (/health 503) and loads the model in the background.

    `on_fatal(message)` is called when the runtime cannot start, so the server can exit.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_start(app, settings, start_runtime, on_fatal))
        try:
            yield
        finally:
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
    )
    app.state.settings = settings
    app.state.runtime = None
    app.state.pipeline = None
    app.state.startup_error = None
    app.state.ready_since = None
    app.include_router(router)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return ApiError(422, str(exc.errors()[0].get("msg", exc)), VALIDATION).tei_response()

    return app


async def _start(app: FastAPI, settings: Settings, start_runtime: RuntimeFactory, on_fatal) -> None:
    try:
        runtime = await start_runtime(settings)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - reported through /health and the exit path
        log.exception("the service could not start")
        app.state.startup_error = f"{type(error).__name__}: {error}"
        if on_fatal is not None:
            on_fatal(app.state.startup_error)
        return
    app.state.runtime = runtime
    app.state.ready_since = int(time.time())
    app.state.pipeline = EmbeddingPipeline(runtime, cache=create_cache(settings))
    tune_gc_for_serving()
    log.info("ready: %s on pools %s", runtime.spec.name, ", ".join(runtime.pool_names))

