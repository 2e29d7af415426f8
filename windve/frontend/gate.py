"""BUSY before the framework: a full service refuses an embedding request at the ASGI door.

Under a storm of clients that re-ask at once, most requests are refusals, and a refusal
that goes through routing, body reading and validation costs the front end (and on a small
machine, the engines beside it) more than the answers it protects. When the dispatcher's
state says there is no room at all, or that it is draining or has no healthy engine, the
gate answers 429 / 503 in the route's error shape without reading the body. A request it
lets through still meets the exact room check and admission in the request path.
"""

from __future__ import annotations

import time

from queue_manager.protocol import Busy, Unavailable
from windve.frontend import metrics
from windve.frontend.pipeline import refusal

# Embedding routes and their metric label and error shape (TEI's or OpenAI's).
GATED = {"/embed": ("embed", "tei"), "/": ("embed", "tei"), "/v1/embeddings": ("openai", "openai"),
         "/embeddings": ("openai", "openai")}  # fmt: skip
SMALL_BODY = 64 * 1024  # larger bodies go the normal way: the server must read them to keep the connection


class OverloadGate:
    def __init__(self, app) -> None:  # the FastAPI app
        self.app = app

    @property
    def state(self):
        return self.app.state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in GATED:
            answer = self._refusal(scope)
            if answer is not None:
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope):
        front_end = self.app.state.runtime
        if front_end is None or not _small(scope):
            return None
        try:
            front_end.dispatcher.check_room(1)
            return None
        except (Busy, Unavailable) as exc:
            error = refusal(exc)
        route, shape = GATED[scope["path"]]
        metrics.ERRORS.labels(route, error.error_type).inc()
        metrics.REQUESTS.labels(route, str(error.status)).inc()
        metrics.E2E_TIME.labels(route).observe(time.perf_counter() - scope.get("windve_arrived", time.perf_counter()))
        return error.tei_response() if shape == "tei" else error.openai_response()


def _small(scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return value.isdigit() and int(value) <= SMALL_BODY
    return False  # chunked: unknown size
