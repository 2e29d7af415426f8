"""Request bodies sent gzip- or deflate-encoded (Content-Encoding, or Transfer-Encoding before
`chunked`) are decoded, within the byte limit once decoded; a content coding the server cannot
decode is a 415 in the route's error shape, such a transfer coding a 501 (RFC 9112 6.1)."""

from __future__ import annotations

import gzip
import http.client
import json
import zlib
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

TEXTS = ["a body sent compressed", "and a second input"]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60, headers={"Cache-Control": "no-store"}) as http:
        yield http


def post(client: httpx.Client, path: str, body: bytes, coding: str) -> httpx.Response:
    return client.post(path, content=body, headers={"Content-Type": "application/json", "Content-Encoding": coding})


@pytest.mark.parametrize(
    ("coding", "encode"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("x-gzip", gzip.compress),
     ("gzip, gzip", lambda body: gzip.compress(gzip.compress(body))), ("identity", lambda body: body),
     # several members (RFC 1952 2.2), as `cat a.gz b.gz` makes; only the first had been read
     ("gzip", lambda body: gzip.compress(body[:9]) + gzip.compress(body[9:]))],
)  # fmt: skip
def test_encoded_bodies_give_the_vectors_of_the_plain_one(client, coding, encode):
    plain = client.post("/embed", json={"inputs": TEXTS}).json()
    assert post(client, "/embed", encode(orjson.dumps({"inputs": TEXTS})), coding).json() == plain
    openai = post(client, "/v1/embeddings", encode(orjson.dumps({"input": TEXTS})), coding)
    assert [item["embedding"] for item in openai.json()["data"]] == plain


def test_a_body_over_the_limit_once_decoded_is_413(client):
    # 3 MiB of one letter compresses to a few KiB: the limit (2 MiB) holds for what it decodes to.
    bomb = gzip.compress(b'{"inputs": "' + b"a" * (3 << 20) + b'"}')
    assert len(bomb) < 64 * 1024
    tei = post(client, "/embed", bomb, "gzip")
    assert tei.status_code == 413 and "once decoded" in tei.json()["error"]
    assert post(client, "/v1/embeddings", bomb, "gzip").status_code == 413


def test_data_that_is_not_what_its_coding_says_is_a_validation_error(client):
    body = orjson.dumps({"inputs": TEXTS})
    tei = post(client, "/embed", body, "gzip")
    assert tei.status_code == 422 and "not valid gzip data" in tei.json()["error"]
    cut_short = gzip.compress(body)[:-12]
    assert "ends before its stream" in post(client, "/embed", cut_short, "gzip").json()["error"]
    for coding, encode in (("gzip", gzip.compress), ("deflate", zlib.compress)):  # had been ignored
        after = post(client, "/embed", encode(body) + b"trailing", coding)
        assert after.status_code == 422 and f"not valid {coding} data" in after.json()["error"], coding
    openai = post(client, "/v1/embeddings", zlib.compress(body)[:5], "deflate")
    assert openai.status_code == 400 and openai.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("coding", ["br", "zstd", "gzip, br"])
def test_a_coding_the_server_cannot_decode_is_415_in_each_shape(client, coding):
    tei = post(client, "/embed", b"\x00\x01", coding)
    assert tei.status_code == 415 and tei.json()["error_type"] == "unsupported_media_type"
    assert tei.headers["accept-encoding"] == "gzip, deflate"
    openai = post(client, "/v1/embeddings", b"\x00\x01", coding)
    assert openai.status_code == 415 and openai.json()["error"]["code"] == "unsupported_content_encoding"


@pytest.mark.parametrize(
    ("lines", "encode", "status"),
    [((("identity",), ("gzip",)), gzip.compress, 200),  # only the first line had been read: 422
     ((("gzip",), ("gzip",)), lambda body: gzip.compress(gzip.compress(body)), 200),
     ((("gzip",), ("br",)), gzip.compress, 415)],  # br had gone unseen: a 200 for a body never brotli'd
)  # fmt: skip
def test_content_encoding_on_several_lines_is_one_list(client, lines, encode, status):
    """RFC 9110 5.3: a field sent on several lines is the list of their values, in order."""
    headers = [("Content-Type", "application/json")] + [("Content-Encoding", value) for (value,) in lines]
    response = client.post("/embed", content=encode(orjson.dumps({"inputs": TEXTS})), headers=headers)
    assert response.status_code == status, response.text
    if status == 200:
        assert response.json() == client.post("/embed", json={"inputs": TEXTS}).json()


def sent_chunked(url: str, requests: list[tuple[str, bytes, dict[str, str]]]) -> list[tuple[int, dict]]:
    """(status, JSON answer) of each request, sent one after another on one connection with the
    body in two chunks and the headers given (Transfer-Encoding among them)."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    answers = []
    try:
        for path, body, headers in requests:
            connection.putrequest("POST", path)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                connection.putheader(name, value)
            connection.endheaders()
            half = len(body) // 2
            for chunk in (body[:half], body[half:]):
                connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            connection.send(b"0\r\n\r\n")
            response = connection.getresponse()
            answers.append((response.status, json.loads(response.read())))
    finally:
        connection.close()
    return answers


@pytest.mark.parametrize(
    ("transfer", "content", "encode"),
    [("gzip, chunked", None, gzip.compress), ("deflate, chunked", None, zlib.compress),
     ("chunked", None, lambda body: body),
     ("gzip, chunked", "deflate", lambda body: gzip.compress(zlib.compress(body)))],
)  # fmt: skip
def test_a_body_with_transfer_codings_gives_the_vectors_of_the_plain_one(server, client, transfer, content, encode):
    """Before, `gzip, chunked` was read as JSON still gzipped (a 422), `deflate, chunked` as if plain."""
    plain = client.post("/embed", json={"inputs": TEXTS}).json()
    headers = {"Transfer-Encoding": transfer, **({"Content-Encoding": content} if content else {})}
    [(status, answer)] = sent_chunked(server.url, [("/embed", encode(orjson.dumps({"inputs": TEXTS})), headers)])
    assert (status, answer) == (200, plain)


def test_a_transfer_coding_the_server_cannot_decode_is_501_and_the_connection_serves_on(server, client):
    plain = client.post("/embed", json={"inputs": TEXTS}).json()
    body = orjson.dumps({"inputs": TEXTS})
    unknown = {"Transfer-Encoding": "compress, chunked"}
    answers = sent_chunked(
        server.url,
        [("/embed", body, unknown), ("/v1/embeddings", orjson.dumps({"input": TEXTS}), unknown),
         ("/embed", body, {"Transfer-Encoding": "chunked"})],
    )  # fmt: skip
    (tei_status, tei), (openai_status, openai), last = answers
    assert tei_status == 501 and tei["error_type"] == "not_implemented" and "'compress'" in tei["error"]
    assert openai_status == 501 and openai["error"]["code"] == "unsupported_transfer_encoding"
    assert last == (200, plain)
