"""Every error answers in JSON, in the shape of the API its path belongs to: OpenAI's under /v1,
/embeddings and /models (400 for bad input), TEI's elsewhere (422, 413, ...).

Most run against the real server; what uvicorn's HTTP parser refuses never reaches the app, so
that is checked on a real uvicorn with the protocol class that answers it in JSON.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import orjson
import pytest
import uvicorn

from windve.frontend.app import create_app
from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol
from windve.settings import Settings

OPENAI_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        yield http


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == OPENAI_KEYS and error["message"]
    assert error["code"] == code
    return error


def assert_tei_error(response: httpx.Response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == error_type
    return body["error"]


OPENAI_UNKNOWN = ["/v1/nothing", "/v1", "/embeddings/x", "/v1/model", "/v1/embeddings/", "/embeddings/"]


@pytest.mark.parametrize("path", OPENAI_UNKNOWN)
def test_unknown_openai_paths_are_openai_404s(client, path):
    error = assert_openai_error(client.post(path, json={}), 404)
    assert error["type"] == "invalid_request_error" and "Invalid URL" in error["message"]


@pytest.mark.parametrize("path", ["/nothing", "/embed/x", "/v2/embeddings", "/embed/", "/health/"])
def test_unknown_paths_elsewhere_are_tei_404s(client, path):
    # A trailing slash too, as TEI answers it: not a bodiless redirect to the path without it.
    assert "no such route" in assert_tei_error(client.get(path), 404, "not_found")
    if path != "/health/":
        assert "no such route" in assert_tei_error(client.post(path, json={"inputs": "x"}), 404, "not_found")


def test_model_id_no_route_pattern_matches_is_model_not_found(client):
    """A newline in the id (%0A) matches no route pattern: still an unknown model, in OpenAI's shape."""
    error = assert_openai_error(client.get("/v1/models/foo%0Abar"), 404, "model_not_found")
    assert error["param"] == "model" and "'foo\\nbar'" in error["message"]
    assert_openai_error(client.get("/models/foo%0Abar"), 404, "model_not_found")


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/", "GET, HEAD, OPTIONS, POST"),
        ("GET", "/embed", "OPTIONS, POST"),
        ("PUT", "/v1/embeddings", "OPTIONS, POST"),
        ("POST", "/v1/models/x", "GET, HEAD, OPTIONS"),
        ("DELETE", "/metrics", "GET, HEAD, OPTIONS"),
        ("POST", "/health", "GET, HEAD, OPTIONS"),
    ],
)
def test_wrong_method_is_405_naming_every_allowed_method(client, method, path, allowed):
    response = client.request(method, path)
    assert response.status_code == 405 and response.headers["allow"] == allowed
    if path.startswith("/v1/"):
        assert allowed in assert_openai_error(response, 405)["message"]
    else:
        assert allowed in assert_tei_error(response, 405, "method_not_allowed")


@pytest.mark.parametrize("path", ["/health", "/", "/info", "/metrics", "/v1/models", "/models", "/v1/models/x"])
def test_every_get_route_answers_head_with_the_gets_status_and_no_body(client, path):
    """RFC 9110 9.1; uptime checks and load balancers probe with HEAD (it was a 405 but on /health)."""
    got, head = client.get(path), client.head(path)
    assert head.status_code == got.status_code and head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]


def test_options_answers_the_methods_a_path_serves(client):
    root = client.options("/")
    assert root.status_code == 204 and root.headers["allow"] == "GET, HEAD, OPTIONS, POST"
    assert client.options("/v1/embeddings").headers["allow"] == "OPTIONS, POST"


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"input": ["a"], "dimensions": -1}, "dimensions"),
        ({"input": ["a"], "dimensions": 10**6}, "dimensions"),
        ({"input": ["a"], "dimensions": "256"}, "dimensions"),
        ({"input": ["a"], "dimensions": True}, "dimensions"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"inputs": "a"}, "input"),
    ],
)
def test_openai_bad_fields_are_400(client, payload, param):
    error = assert_openai_error(client.post("/v1/embeddings", json=payload), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param


@pytest.mark.parametrize(
    "body", [b"", b"[1, 2]", b'{"input": "a",', b'{"input": "\\ud800"}', b"\xff\xfe", b"[" * 5000 + b"]" * 5000]
)
def test_openai_undecodable_bodies_are_400(client, body):
    response = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
    assert assert_openai_error(response, 400)["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [b"", b'{"inputs": "a",', b"\xff\xfe", b'{"inputs": "a", "dimensions": 1e400}'])
def test_tei_undecodable_bodies_are_422(client, body):
    response = client.post("/embed", content=body, headers={"content-type": "application/json"})
    assert_tei_error(response, 422, "validation")


def test_too_many_inputs_is_400_for_openai_and_413_for_tei(client):
    limit = client.get("/info").json()["max_client_batch_size"]
    too_many = client.post("/v1/embeddings", json={"input": ["a"] * (limit + 1)})
    error = assert_openai_error(too_many, 400, "payload_too_large")
    assert error["param"] == "input" and f"maximum allowed batch size {limit}" in error["message"]
    assert_tei_error(client.post("/embed", json={"inputs": ["a"] * (limit + 1)}), 413, "payload_too_large")


def test_body_over_the_byte_limit_is_413_in_both_shapes(client):
    big = {"input": "word " * (1024 * 1024)}
    assert_openai_error(client.post("/v1/embeddings", json=big), 413, "payload_too_large")
    assert_tei_error(client.post("/embed", json={"inputs": big["input"]}), 413, "payload_too_large")


def test_declared_length_over_the_limit_is_413_before_the_body_is_sent(server):
    """A client that declares a huge body gets its 413 without sending it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 9999999999\r\n\r\n")
        status, body = read_answer(sock)
    assert status == 413 and body["error"]["code"] == "payload_too_large"


# --- What the HTTP parser refuses: a real uvicorn with the JSON-answering protocol class. ---


async def never_ready(settings: Settings):
    await asyncio.Event().wait()


@pytest.fixture(scope="module")
def parser_port():
    """uvicorn serving the app (loading forever: the parser answers before the app would) on a
    socket bound before it starts, so connections wait in the backlog until it accepts."""
    listener = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        create_app(Settings(), start_runtime=never_ready), http=JsonErrorHttpToolsProtocol, log_level="error"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    server.should_exit = True
    thread.join(60)
    listener.close()


def read_answer(sock: socket.socket) -> tuple[int, dict]:
    """Status and JSON body of one answer on a connection the server closes after it."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < content_length(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return int(head.split(b" ", 2)[1]), orjson.loads(body)


def content_length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def ask(port: int, raw: bytes) -> tuple[int, dict]:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(raw)
        return read_answer(sock)


def test_content_length_past_64_bits_is_a_json_413(parser_port):
    huge = b"Content-Length: 99999999999999999999\r\n\r\n{}"
    status, body = ask(parser_port, b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n" + huge)
    assert status == 413 and body["error"]["code"] == "payload_too_large"
    assert "Content-Length" in body["error"]["message"]
    status, body = ask(parser_port, b"POST /embed HTTP/1.1\r\nHost: x\r\n" + huge)
    assert status == 413 and body["error_type"] == "payload_too_large"


@pytest.mark.parametrize(
    ("path", "header", "reason"),
    [
        (b"/embed", b"Content-Length: 12abc", "Invalid character in Content-Length"),
        (b"/v1/embeddings", b"Content-Length: 2\r\nContent-Length: 3", "Duplicate Content-Length"),
        (b"/embed", b"Bad Header: x", "Invalid header token"),
    ],
)
def test_malformed_requests_are_json_400s(parser_port, path, header, reason):
    status, body = ask(parser_port, b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n\r\n{}")
    assert status == 400
    message = body["error"]["message"] if path.startswith(b"/v1/") else body["error"]
    assert reason in message
