"""Browsers calling the API from a page of another origin (CORS): every answer a real server
makes carries the headers that let the page read it, and a preflight is answered without the key."""

from __future__ import annotations

import httpx
import pytest

from tests.frontend.conftest import MATRYOSHKA_KEY, MATRYOSHKA_ORIGINS
from windve.frontend.cors import CorsPolicy, policy_of
from windve.settings import SettingsError, load_settings

PAGE = "https://app.example"
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}


def test_the_setting_reads_as_written_by_hand_and_refuses_what_a_browser_never_sends() -> None:
    assert load_settings().cors_allow_origins == ["*"]
    assert load_settings(cors_allow_origins="https://a.example, http://b.example:8080").cors_allow_origins == [
        "https://a.example",
        "http://b.example:8080",
    ]
    assert load_settings(cors_allow_origins='["https://a.example"]').cors_allow_origins == ["https://a.example"]
    assert policy_of(load_settings(cors_allow_origins="[]")) is None  # no CORS headers at all
    with pytest.raises(SettingsError, match="cors_allow_origins.*no path or trailing slash"):
        load_settings(cors_allow_origins="https://a.example/")


def test_the_policy_answers_only_allowed_origins_and_only_browsers() -> None:
    listed = CorsPolicy(["https://a.example"])
    assert listed.answer_headers([(b"origin", b"https://a.example")]) == [
        (b"access-control-allow-origin", b"https://a.example"),
        (b"vary", b"origin"),
        (b"access-control-expose-headers", b"retry-after"),
    ]
    assert listed.answer_headers([(b"origin", b"https://b.example")]) == []
    assert CorsPolicy(["*"]).answer_headers([(b"content-type", b"application/json")]) == []  # not a browser's call
    # Not a preflight without the method it asks for; not answered for an origin not allowed.
    assert listed.preflight_headers([(b"origin", b"https://a.example")], {"POST"}) == []
    asked = [(b"origin", b"https://b.example"), (b"access-control-request-method", b"POST")]
    assert listed.preflight_headers(asked, {"POST"}) == []


def test_any_origin_by_default_on_answers_and_errors(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        ok = client.post("/embed", json={"inputs": "a"}, headers={"Origin": PAGE})
        bad = client.post("/v1/embeddings", json={"input": []}, headers={"Origin": PAGE})
        info = client.get("/info", headers={"Origin": PAGE})
        plain = client.post("/embed", json={"inputs": "a"})
    assert ok.status_code == 200 and bad.status_code == 400 and info.status_code == 200
    for answer in (ok, bad, info):
        assert answer.headers["access-control-allow-origin"] == "*"
        assert answer.headers["access-control-expose-headers"] == "retry-after"
    assert "access-control-allow-origin" not in plain.headers


def test_a_preflight_is_answered_with_what_the_page_asked_to_send(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.options("/v1/embeddings", headers={"Origin": PAGE, **PREFLIGHT})
    assert answer.status_code == 204
    assert answer.headers["access-control-allow-origin"] == "*"
    assert answer.headers["access-control-allow-methods"] == "POST"
    assert answer.headers["access-control-allow-headers"] == "authorization, content-type"
    assert int(answer.headers["access-control-max-age"]) > 0


def test_listed_origins_with_an_api_key(matryoshka_server) -> None:
    # The key is not asked of a preflight (browsers never send it there), and a 401 is readable.
    allowed, other = MATRYOSHKA_ORIGINS[0], "https://elsewhere.example"
    keyed = {"Authorization": f"Bearer {MATRYOSHKA_KEY}"}
    with httpx.Client(base_url=matryoshka_server.url, timeout=60) as client:
        preflight = client.options("/embed", headers={"Origin": allowed, **PREFLIGHT})
        ok = client.post("/embed", json={"inputs": "a"}, headers={"Origin": allowed, **keyed})
        refused = client.post("/embed", json={"inputs": "a"}, headers={"Origin": allowed})
        foreign = client.post("/embed", json={"inputs": "a"}, headers={"Origin": other, **keyed})
        foreign_preflight = client.options("/embed", headers={"Origin": other, **PREFLIGHT})
    assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == allowed
    assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == allowed
    assert ok.headers["vary"] == "origin"
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == allowed
    # Served (the key is right), but the browser is not told it may read the answer.
    assert foreign.status_code == 200 and "access-control-allow-origin" not in foreign.headers
    assert foreign_preflight.status_code == 204
    assert "access-control-allow-methods" not in foreign_preflight.headers
