"""Requests that ask to upgrade the connection are served over HTTP/1.1.

`curl --http2` over http:// sends `Connection: Upgrade, HTTP2-Settings` and `Upgrade: h2c`; a
WebSocket client sends `Upgrade: websocket`. WindVE upgrades to neither, so it serves the request
as sent, as TEI does (RFC 9110 7.8 lets a server ignore Upgrade). httptools has its parser skip
the body of such a request: uvicorn served it with an empty body (422) and lost the requests
pipelined behind it; with uvicorn's WebSocket protocol (websockets is installed) a POST that asked
for one was never answered, and made the SIGTERM drain fail. The HTTP tests run the real protocol
under uvicorn on 127.0.0.1 with raw sockets; the last one a real `windve serve`.
"""

from __future__ import annotations

import json
import signal
import socket

import httpx
import pytest

from tests.servers import asgi_body, read_answers, start_server, uvicorn_in_thread
from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol

BODY = json.dumps({"inputs": "hello"}).encode()
H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"
WEBSOCKET = (b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")


class EchoApp:
    """Answers each request with its method, path and body."""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await asgi_body(receive)
        answer = json.dumps({"method": scope["method"], "path": scope["path"], "body": body.decode()}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})


@pytest.fixture
def port():
    with uvicorn_in_thread(EchoApp(), http=JsonErrorHttpToolsProtocol, loop="asyncio", ws="none") as (_, port):
        yield port


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n".encode() + extra + b"\r\n" + body)


def echoed(answers: list) -> list[tuple[int, dict]]:
    return [(status, json.loads(body)) for status, _, body in answers]


@pytest.mark.parametrize("upgrade", [H2C, WEBSOCKET], ids=["h2c", "websocket"])
def test_a_request_asking_to_upgrade_is_served_with_its_body_and_what_follows_it(port, upgrade) -> None:
    second = json.dumps({"inputs": "behind"}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(post("/embed", BODY, upgrade) + post("/v1/embeddings", second) + b"GET /info HTTP/1.1\r\n\r\n")
        answers = echoed(read_answers(client, 3))
    assert answers == [
        (200, {"method": "POST", "path": "/embed", "body": BODY.decode()}),
        (200, {"method": "POST", "path": "/v1/embeddings", "body": second.decode()}),
        (200, {"method": "GET", "path": "/info", "body": ""}),
    ]


def test_the_body_may_come_in_pieces_after_the_head(port) -> None:
    body = json.dumps({"inputs": ["a" * 5000, "b"]}).encode()
    request = post("/embed", body, H2C)
    head_end = request.index(b"\r\n\r\n") + 4
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        # The head, then the body in three sends, the last with a request behind it.
        for piece in (request[:head_end], request[head_end : head_end + 7], request[head_end + 7 : -3]):
            client.sendall(piece)
        client.sendall(request[-3:] + post("/embed", BODY, H2C))
        answers = echoed(read_answers(client, 2))
    assert [answer["body"] for _, answer in answers] == [body.decode(), BODY.decode()]


def test_a_chunked_body_asking_to_upgrade_gets_a_400_that_says_why(port) -> None:
    request = (b"POST /embed HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n" + H2C + b"\r\n"
               + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(request)
        [(status, headers, body)] = read_answers(client, 1)
        assert client.recv(1) == b""  # closed: what followed the head cannot be read as HTTP
    assert status == 400 and headers["connection"] == "close"
    assert "Content-Length" in json.loads(body)["error"]


def test_a_websocket_upgrade_is_answered_and_the_service_drains(tmp_path) -> None:
    server = start_server(tmp_path, "--cpu-depth", "8")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as client:
            client.sendall(post("/embed", BODY, WEBSOCKET + b"Content-Type: application/json\r\n"))
            [(status, _, body)] = read_answers(client, 1)
            assert status == 200 and len(json.loads(body)[0]) == 384
            # Kept open, as a WebSocket client would: the drain must still end cleanly.
            reference = httpx.post(server.url + "/embed", json={"inputs": "hello"}, timeout=60).json()
            assert json.loads(body) == reference
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=60) == 0, server.log()[-3000:]
    finally:
        server.stop()
    assert "Traceback" not in server.log()
