"""Bodies no client library would send, against the real server: each gets an answer below 500.

The routes' fields with values of every JSON type (and some that are not valid JSON: NaN,
Infinity), lone surrogates, huge integers, unknown fields, and bodies that are not objects. A
bad one must get a 4xx with a JSON error, never a 500 or a dropped connection.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROUTES = {
    "/embed": ("inputs", "normalize", "truncate", "truncation_direction", "dimensions", "prompt_name"),
    "/": ("inputs", "normalize", "truncate", "dimensions"),
    "/tokenize": ("inputs", "add_special_tokens", "prompt_name"),
    "/decode": ("ids", "skip_special_tokens"),
    "/v1/embeddings": ("input", "model", "encoding_format", "dimensions", "user"),
}

texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\x00", "right", "left", "float", "base64", "query", "\ud800", "a\udfffb"]),
    st.lists(st.characters(), max_size=8).map("".join),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 128, 384, 385, 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    texts,
)
token_ids = st.lists(st.one_of(st.integers(-2, 30530), st.sampled_from([0, 100, 101, 102, 2**31])), max_size=6)
WELL_FORMED = {
    "/decode": token_ids | st.lists(token_ids, min_size=1, max_size=3),
    # TEI's /embed takes token ids too: alone, or among the texts
    "/embed": texts | token_ids | st.lists(texts | token_ids, min_size=1, max_size=3),
}
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    route = draw(st.sampled_from(sorted(ROUTES)))
    if draw(st.integers(0, 9)) == 0:  # now and then, not an object at all
        document = draw(values)
    else:
        fields = draw(st.lists(st.sampled_from(ROUTES[route]), unique=True, max_size=len(ROUTES[route])))
        document = {field: draw(values) for field in fields}
        # The text field mostly well-formed, so that the others are checked beyond it.
        text_field = ROUTES[route][0]
        if draw(st.booleans()):
            document[text_field] = draw(WELL_FORMED.get(route, texts | st.lists(texts, min_size=1, max_size=3)))
        if draw(st.integers(0, 4)) == 0:
            document[draw(st.text(min_size=1, max_size=8))] = draw(values)
    # ensure_ascii writes a lone surrogate as its \u escape, and allow_nan writes NaN and Infinity
    # bare: both are bodies a careless client sends.
    return route, json.dumps(document, allow_nan=True).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=bodies())
def test_no_body_gets_a_server_error(server, case: tuple[str, bytes]) -> None:
    route, body = case
    answer = httpx.post(server.url + route, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert answer.status_code < 500, (route, body[:300], answer.status_code, answer.text[:300])
    payload = answer.json()  # a JSON answer either way: vectors, tokens, or an error that says why
    if answer.status_code >= 400:
        assert isinstance(payload, dict) and payload, (route, body[:300], answer.text[:300])


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_an_empty_object_names_the_missing_field(server, route: str) -> None:
    answer = httpx.post(server.url + route, json={}, timeout=60)
    assert 400 <= answer.status_code < 500
    assert ROUTES[route][0] in answer.text
