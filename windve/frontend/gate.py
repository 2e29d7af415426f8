"""BUSY before the framework: a full service refuses an embedding request at the ASGI door.

Under a storm of clients that re-ask at once, most requests are refusals, and a refusal
that goes through routing, body reading and validation costs the front end (and on a small
machine, the engines beside it) more than the answers it protects. When the dispatcher's
state says there is no room at all, or that it is draining or has no healthy engine, the
gate answers 429 / 503 in the route's error shape without reading the body. A request it
lets through still meets the exact room check and admission in the request path.
"""

from __future__ import annotations

import functools

from queue_manager.protocol import Busy, Unavailable
from windve.frontend import metrics
from windve.frontend.errors import ApiError
from windve.frontend.pipeline import refusal

# Embedding routes and their metric label; the error's shape (TEI's or OpenAI's) follows from the path.
GATED = {"/embed": "embed", "/": "embed", "/v1/embeddings": "openai", "/embeddings": "openai"}
SMALL_BODY = 64 * 1024  # larger bodies go the normal way: the server must read them to keep the connection


class OverloadGate:
    """The ASGI side of the gate. The HTTP protocol (http_protocol.py) asks the same question
    earlier, before it starts a request task, and answers from a cache of rendered refusals."""

    def __init__(self, app) -> None:  # the FastAPI app
        self.app = app

    @property
    def state(self):
        return self.app.state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            refused = self.refusal(scope["path"], scope["headers"])
            if refused is not None:
                await refused.response_for(scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, path: str, headers) -> ApiError | None:
        """The 429 / 503 for a POST to `path` that the dispatcher has no room for, counted in the
        metrics (answer it with `error.response_for(path)`); None to let the request through."""
        route = GATED.get(path)
        front_end = self.app.state.runtime
        if route is None or front_end is None or not _small(headers):
            return None
        try:
            front_end.dispatcher.check_room(1)
            return None
        except (Busy, Unavailable) as exc:
            error = refusal(exc)
        _count(route, error)
        return error


@functools.lru_cache(maxsize=64)
def _counters(route: str, error_type: str, status: int):
    # Labelled children looked up once: under a storm the lookups cost as much as the answer.
    return (
        metrics.ERRORS.labels(route, error_type),
        metrics.REQUESTS.labels(route, str(status)),
        metrics.E2E_TIME.labels(route),
    )


def _count(route: str, error: ApiError) -> None:
    errors, requests, e2e = _counters(route, error.error_type, error.status)
    errors.inc()
    requests.inc()
    e2e.observe(0.0)  # answered before any work: the time to read it is the client's, not ours


def _small(headers) -> bool:
    for name, value in headers:
        if name == b"content-length":
            return value.isdigit() and int(value) <= SMALL_BODY
    return False  # chunked: unknown size
