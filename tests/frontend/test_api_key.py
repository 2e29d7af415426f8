"""The optional bearer API key: embedding routes, /v1/models and /info need it; /health and /metrics do not.

The key is not ASCII, so the tests also pin how it is compared: on the bytes the client sent,
against the key encoded as UTF-8.
"""

from __future__ import annotations

import httpx
import pytest

from tests.servers import start_server

KEY = "s3cret-clé-ключ"
AUTH = {"Authorization": b"Bearer " + KEY.encode("utf-8")}  # httpx sends bytes values as they are


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    env = {"WINDVE_API_KEY": KEY, "WINDVE_CACHE_SIZE": "0", "WINDVE_CPU_DEPTH": "64"}  # a set depth: no probe
    server = start_server(tmp_path_factory.mktemp("keyed"), env=env)
    yield server
    server.stop()


@pytest.mark.parametrize(
    "header",
    [
        None,
        b"Bearer wrong",
        b"Basic " + KEY.encode(),
        b"Bearer " + KEY.encode() + b"x",
        b"Bearer s3cret-cl\xe9-" + "ключ".encode(),  # the é as latin-1: other bytes, so another key
        b"Bearer s3cret-cl\xc3\xa9",  # a prefix of the key's bytes
    ],
)
def test_missing_or_wrong_key_is_401(keyed_server, header):
    headers = {"Authorization": header} if header else {}
    tei = httpx.post(keyed_server.url + "/embed", json={"inputs": "x"}, headers=headers)
    assert tei.status_code == 401 and tei.json()["error_type"] == "unauthorized"
    assert tei.headers["www-authenticate"] == "Bearer"
    openai = httpx.post(keyed_server.url + "/v1/embeddings", json={"input": "x"}, headers=headers)
    assert openai.status_code == 401 and openai.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(keyed_server.url + "/info", headers=headers).status_code == 401
    for path in ("/v1/models", "/models", "/v1/models/any", "/v1/models/foo%0Abar"):
        models = httpx.get(keyed_server.url + path, headers=headers)
        assert models.status_code == 401 and models.json()["error"]["code"] == "invalid_api_key", path
    tokenize = httpx.post(keyed_server.url + "/tokenize", json={"inputs": "x"}, headers=headers)
    assert tokenize.status_code == 401 and tokenize.json()["error_type"] == "unauthorized"
    decode = httpx.post(keyed_server.url + "/decode", json={"ids": [101]}, headers=headers)
    assert decode.status_code == 401 and decode.json()["error_type"] == "unauthorized"
    infinity = httpx.post(keyed_server.url + "/embeddings", json={"input": "x"}, headers=headers)
    assert infinity.status_code == 401 and infinity.json()["error"]["code"] == "invalid_api_key"


def test_the_keys_utf8_bytes_are_served_and_probes_stay_public(keyed_server):
    assert httpx.post(keyed_server.url + "/embed", json={"inputs": "x"}, headers=AUTH).status_code == 200
    assert httpx.post(keyed_server.url + "/v1/embeddings", json={"input": "x"}, headers=AUTH).status_code == 200
    assert httpx.post(keyed_server.url + "/tokenize", json={"inputs": "x"}, headers=AUTH).status_code == 200
    assert httpx.post(keyed_server.url + "/decode", json={"ids": [101]}, headers=AUTH).json() == [""]
    assert httpx.get(keyed_server.url + "/info", headers=AUTH).status_code == 200
    assert httpx.get(keyed_server.url + "/v1/models", headers=AUTH).status_code == 200
    scheme_in_capitals = {"Authorization": b"BEARER  " + KEY.encode()}
    assert httpx.post(keyed_server.url + "/embed", json={"inputs": "x"}, headers=scheme_in_capitals).status_code == 200
    assert httpx.get(keyed_server.url + "/health").status_code == 200
    assert httpx.get(keyed_server.url + "/metrics").status_code == 200
    assert KEY not in httpx.get(keyed_server.url + "/info", headers=AUTH).text

