"""windve_request_seconds holds the answers' latencies only, each from the request's arrival: a storm
of instant refusals must not pull its p99 down while the accepted requests miss the SLO."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from prometheus_client import REGISTRY
from starlette.requests import Request
from starlette.responses import Response

from queue_manager.protocol import Busy
from windve.frontend.errors import OVERLOADED, VALIDATION, ApiError
from windve.frontend.gate import GATED, OverloadGate
from windve.frontend.pipeline import ARRIVED
from windve.frontend.routes import _answered
from windve.settings import Settings

ROUTE = "embed"
EARLIER = 0.3  # seconds before the handler ran that the request's bytes arrived


def latency(route: str = ROUTE) -> tuple[float, float]:
    """(sum, count) of windve_request_seconds for `route`."""
    labels = {"route": route}
    total = REGISTRY.get_sample_value("windve_request_seconds_sum", labels) or 0.0
    count = REGISTRY.get_sample_value("windve_request_seconds_count", labels) or 0.0
    return total, count


def answered(status: int, route: str = ROUTE) -> float:
    return REGISTRY.get_sample_value("windve_requests_total", {"route": route, "status": str(status)}) or 0.0


def request(arrived: float | None = None) -> Request:
    app = SimpleNamespace(state=SimpleNamespace(settings=Settings()))
    scope = {"type": "http", "method": "POST", "path": "/embed", "headers": [], "app": app}
    if arrived is not None:
        scope[ARRIVED] = arrived
    return Request(scope)


def run(handle, arrived: float | None = None, route: str = ROUTE, shape=None) -> Response:
    def status_only(error: ApiError) -> Response:  # the route's error body: not what is tested here
        return Response(status_code=error.status)

    return asyncio.run(_answered(request(arrived), route, handle, shape or status_only))


def test_an_answer_counts_from_its_arrival() -> None:
    async def handle() -> Response:
        return Response(b"[]")

    (total, count), ok = latency(), answered(200)
    assert run(handle, arrived=time.perf_counter() - EARLIER).status_code == 200
    after_total, after_count = latency()
    assert after_count == count + 1 and answered(200) == ok + 1
    assert after_total - total >= EARLIER


def test_refusals_and_errors_are_counted_but_not_timed() -> None:
    for status, kind in ((429, OVERLOADED), (422, VALIDATION)):

        async def handle(status: int = status, kind: str = kind) -> Response:
            raise ApiError(status, "refused", kind)

        before, count = latency(), answered(status)
        assert run(handle, arrived=time.perf_counter() - EARLIER).status_code == status
        assert latency() == before and answered(status) == count + 1


class FullDispatcher:
    def check_room(self, wanted: int, promised: int = 0) -> None:
        raise Busy(retry_after=1.0)


def test_the_gates_refusals_are_counted_but_not_timed() -> None:
    runtime = SimpleNamespace(dispatcher=FullDispatcher())
    app = SimpleNamespace(state=SimpleNamespace(runtime=runtime, settings=Settings()))
    gate = OverloadGate(app)
    headers = [(b"content-length", b"20")]
    before, count = latency(), answered(429)
    error = gate.refusal("/embed", headers, {ARRIVED: time.perf_counter() - EARLIER})
    assert error is not None and error.status == 429
    assert latency() == before and answered(429) == count + 1


def test_answers_that_are_not_embeddings_are_counted_but_not_timed() -> None:
    """/tokenize and the model lists answer at once; timed, they would dilute the SLO's share."""

    async def handle() -> Response:
        return Response(b"{}")

    for route in ("tokenize", "models"):
        before, count = latency(route), answered(200, route)
        assert run(handle, arrived=time.perf_counter() - EARLIER, route=route).status_code == 200
        assert latency(route) == before and answered(200, route) == count + 1
    for route in set(GATED.values()):  # every embedding route's answers are timed
        (total, count), ok = latency(route), answered(200, route)
        assert run(handle, arrived=time.perf_counter() - EARLIER, route=route).status_code == 200
        after_total, after_count = latency(route)
        assert after_count == count + 1 and after_total - total >= EARLIER and answered(200, route) == ok + 1


def test_an_openai_error_is_counted_with_the_status_it_was_sent_with() -> None:
    async def handle() -> Response:
        raise ApiError(422, "inputs must not be empty", VALIDATION)

    sent_400, sent_422 = answered(400, "openai"), answered(422, "openai")
    response = run(handle, route="openai", shape=ApiError.openai_response)
    assert response.status_code == 400
    assert answered(400, "openai") == sent_400 + 1 and answered(422, "openai") == sent_422
