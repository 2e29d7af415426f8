"""The overload gate calls the embedding routes straight (routes.DIRECT_ROUTES), without the
framework's routing, dependency solving and middleware: the same answers as through the app, and
an exception no route expected gets the app's 500 in the route's shape."""

from __future__ import annotations

import asyncio
import socket

from starlette.testclient import TestClient

from tests.servers import uvicorn_in_thread, wait_for
from windve.frontend import metrics
from windve.frontend.app import create_app
from windve.frontend.gate import GATED, OverloadGate
from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol
from windve.frontend.routes import DIRECT_ROUTES, embed, openai_embeddings
from windve.settings import Settings

# Each route's answers before the model is ready (503), and to a bad body (422 / 400 before that).
CALLS = [
    ("/embed", {"json": {"inputs": "x"}}),
    ("/", {"json": {"inputs": ["x", "y"]}}),
    ("/embed", {"json": {"inputs": 5}}),
    ("/embed", {"content": b"{", "headers": {"content-type": "application/json"}}),
    ("/v1/embeddings", {"json": {"input": "x"}}),
    ("/embeddings", {"json": {"input": 5}}),
]


async def never_ready(settings: Settings):
    await asyncio.Event().wait()


def _answers(direct: bool) -> tuple[list[tuple], list[str]]:
    app = create_app(Settings(), start_runtime=never_ready)
    through_the_framework: list[str] = []

    @app.middleware("http")
    async def note(request, call_next):
        through_the_framework.append(request.url.path)
        return await call_next(request)

    gate = OverloadGate(app, DIRECT_ROUTES if direct else None)
    with TestClient(gate) as client:
        answers = []
        for path, request in CALLS:
            answer = client.post(path, **request)
            answers.append((path, answer.status_code, answer.json(), answer.headers.get("retry-after")))
        assert client.post("/tokenize", json={"inputs": "x"}).status_code == 503  # not a direct route
    return answers, through_the_framework


def test_the_embedding_routes_answer_alike_straight_and_through_the_framework():
    direct, framework_paths = _answers(direct=True)
    through, every_path = _answers(direct=False)
    assert direct == through
    assert {status for _, status, _, _ in direct} == {503, 422, 400}
    assert framework_paths == ["/tokenize"]  # the embedding routes skipped the framework's middleware
    assert every_path == [path for path, _ in CALLS] + ["/tokenize"]


def test_an_unexpected_error_on_a_direct_route_is_the_apps_500_in_the_routes_shape(caplog):
    async def broken(request):
        raise RuntimeError("boom")

    app = create_app(Settings(), start_runtime=never_ready)
    gate = OverloadGate(app, {"/embed": broken, "/v1/embeddings": broken})
    with TestClient(gate) as client:
        tei = client.post("/embed", json={"inputs": "x"})
        openai = client.post("/v1/embeddings", json={"input": "x"})
    assert tei.status_code == 500 and "internal error (RuntimeError)" in tei.json()["error"]
    assert openai.status_code == 500 and "internal error (RuntimeError)" in openai.json()["error"]["message"]
    assert "unexpected error answering POST /embed" in caplog.text and "boom" in caplog.text


def test_a_client_gone_while_its_body_was_read_is_counted_499_not_200():
    app = create_app(Settings(), start_runtime=never_ready)
    closed = metrics.REQUESTS.labels("embed", "499")
    before, answered_before = closed._value.get(), metrics.REQUESTS.labels("embed", "200")._value.get()
    with uvicorn_in_thread(OverloadGate(app, DIRECT_ROUTES), http=JsonErrorHttpToolsProtocol) as (_, port):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            head = b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            sock.sendall(head + b'{"inputs": ')  # the rest of the body never comes
        wait_for(lambda: closed._value.get() == before + 1, "the gone client was not counted 499")
    assert metrics.REQUESTS.labels("embed", "200")._value.get() == answered_before


def test_the_gate_guards_every_embedding_route_and_labels_it_by_its_api():
    assert DIRECT_ROUTES == {"/embed": embed, "/": embed, "/v1/embeddings": openai_embeddings,
                             "/embeddings": openai_embeddings}
    labels = {embed: "embed", openai_embeddings: "openai"}
    assert GATED == {path: labels[endpoint] for path, endpoint in DIRECT_ROUTES.items()}
