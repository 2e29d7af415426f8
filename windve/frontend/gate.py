"""BUSY before the framework: a full service refuses an embedding request at the ASGI door.

Under a storm of clients that re-ask at once, most requests are refusals, and a refusal
that goes through routing, body reading and validation costs the front end (and on a small
machine, the engines beside it) more than the answers it protects. When the dispatcher's
state says there is no room at all, or that it is draining or has no healthy engine, the
gate answers 429 / 503 in the route's error shape without reading the body. A request it
lets through still meets the exact room check and admission in the request path.

A request let through holds a pass until its handler reaches that room check (or ends, or waits
for the rest of its body from the client: http_protocol.py, body.py): the
gate lets through only as many as the room less the passes held. The room is taken at
admission, a loop step or more after the gate let the request in; without the passes, every
request read in the step after room freed went through, and all but the first few were
refused only after their parsing, validation and tokenizing.

A request without the API key (setting `api_key`) is let through, to its 401: a wrong key is
answered as wrong whatever the load, and the load is not told to a client without the key.

A request that waited in its socket while its connection sat in the slow lane (slow_lane.py)
for longer than the SLO leaves beyond the pools' live p99 (`lane_budget`) is refused whatever
the room: admitted, it would answer past the SLO, and the room is kept for requests that can
still meet it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from queue_manager.depth_control import DEFAULT_HEADROOM
from queue_manager.protocol import Busy, Unavailable
from windve.frontend import metrics
from windve.frontend.auth import authorized
from windve.frontend.errors import OVERLOADED, ApiError
from windve.frontend.fallbacks import internal_error
from windve.frontend.pipeline import ARRIVED, BUSY_ANSWERED, GATE_PASS, LANE_WAIT, refusal, release_pass
from windve.frontend.routes import DIRECT_ROUTES, EMBEDDING_ROUTES

if TYPE_CHECKING:
    from fastapi import FastAPI

    from windve.dispatcher.client import LocalDispatcher, RemoteDispatcher

log = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]

# Embedding routes and their metric label; the error's shape (TEI's or OpenAI's) follows from the path.
GATED = {path: EMBEDDING_ROUTES[endpoint] for path, endpoint in DIRECT_ROUTES.items()}
SMALL_BODY = 64 * 1024  # larger bodies go the normal way: the server must read them to keep the connection
LATE = "model is overloaded: this request waited too long to be read to meet the latency SLO"


class GatePass:
    """A request let through the gate, not yet at its room check; `release` is idempotent."""

    __slots__ = ("_gate",)

    def __init__(self, gate: OverloadGate) -> None:
        self._gate: OverloadGate | None = gate
        gate.passes += 1

    def release(self) -> None:
        if self._gate is not None:
            self._gate.passes -= 1
            self._gate = None


class OverloadGate:
    """The ASGI side of the gate. The HTTP protocol (http_protocol.py) asks the same question
    earlier, before it starts a request task, and answers from a cache of rendered refusals."""

    def __init__(self, app: FastAPI, direct: Mapping[str, Endpoint] | None = None) -> None:
        self.app = app
        # POST routes called straight, without the app's routing and middleware (routes.DIRECT_ROUTES).
        self.direct = dict(direct or {})
        self.passes = 0  # requests let through and not yet at their room check

    @property
    def state(self) -> State:
        return self.app.state

    def lane_budget(self) -> float:
        """How long a request may have waited in its socket in the slow lane and still be admitted:
        what the SLO leaves beyond the pools' live p99, and at least its headroom, which the depths
        leave free for waits they do not see.

        The headroom alone (0.15 s at 1 s) is about one loop step of a niced front end beside busy
        engines, and about what the lane makes a parked client wait: a client refused once was
        then refused at each re-ask, with room free and the tail at 0.6 s, and the pool, never
        full, never rose (bench/DEPTH_CONTROL.md)."""
        slo = self.app.state.settings.slo_seconds
        runtime = self.app.state.runtime
        tail = None if runtime is None else runtime.dispatcher.live_tail()
        headroom = slo * DEFAULT_HEADROOM
        return headroom if tail is None else max(headroom, slo - tail)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = None
        if scope["type"] == "http" and scope["method"] == "POST":
            if GATE_PASS not in scope:
                refused = self.refusal(scope["path"], scope["headers"], scope)
                if refused is not None:
                    scope[BUSY_ANSWERED] = refused.status == 429
                    await refused.response_for(scope["path"])(scope, receive, send)
                    return
            endpoint = self.direct.get(scope["path"])
        try:
            if endpoint is None:
                await self.app(scope, receive, send)
            else:
                await self._call(endpoint, scope, receive, send)
        finally:
            release_pass(scope)

    async def _call(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer with `endpoint` as the app's router would, an unexpected exception with the app's 500."""
        scope["app"] = self.app
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as exc:  # noqa: BLE001 - as the app's fallback handler answers it
            log.exception("unexpected error answering %s %s", scope["method"], scope["path"])
            response = internal_error(request, exc)
        await response(scope, receive, send)

    def refusal(self, path: str, headers: Iterable[tuple[bytes, bytes]], scope: dict) -> ApiError | None:
        """The 429 / 503 for a POST to `path` that the dispatcher has no room for, counted in the
        metrics (answer it with `error.response_for(path)`); None to let the request through,
        with a pass in `scope` when it is one the gate keeps."""
        route = GATED.get(path)
        front_end = self.app.state.runtime
        if route is None or front_end is None or not _small(headers):
            return None
        if not authorized(headers, self.app.state.settings.api_key):
            return None  # the route answers 401
        error = self._refused(front_end.dispatcher, scope)
        if error is None:
            scope[GATE_PASS] = GatePass(self)
            return None
        _count(route, error)
        return error

    def _refused(self, dispatcher: LocalDispatcher | RemoteDispatcher, scope: dict) -> ApiError | None:
        if scope.get(LANE_WAIT) and time.perf_counter() - scope[ARRIVED] > self.lane_budget():
            metrics.LATE.inc()
            return ApiError(429, LATE, OVERLOADED, retry_after=1.0)
        try:
            dispatcher.check_room(1, promised=self.passes)
        except (Busy, Unavailable) as exc:
            return refusal(exc)
        return None


@functools.lru_cache(maxsize=64)
def _counters(route: str, error_type: str, status: int):
    # Labelled children looked up once: under a storm the lookups cost as much as the answer.
    return metrics.ERRORS.labels(route, error_type), metrics.REQUESTS.labels(route, str(status))


def _count(route: str, error: ApiError) -> None:
    errors, requests = _counters(route, error.error_type, error.status)
    errors.inc()
    requests.inc()


def _small(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"content-length":
            return value.isdigit() and int(value) <= SMALL_BODY
    return False  # chunked: unknown size
