"""A running server as a pool: exact-length texts and the HTTP submitter, over real HTTP."""

from __future__ import annotations

import asyncio

import pytest
from tokenizers import Tokenizer

from estimator.http_pool import ClientPerRequest, ExactLengthTexts, http_submitter, server_info
from estimator.rounds import run_round
from windve.model import ModelSpec


@pytest.fixture(scope="module")
def tokenizer(model_spec: ModelSpec) -> Tokenizer:
    loaded = Tokenizer.from_file(str(model_spec.path / "tokenizer.json"))
    loaded.no_padding()
    loaded.no_truncation()
    return loaded


@pytest.mark.parametrize("tokens", [3, 16, 75, 256, 400])
def test_texts_have_exactly_the_asked_token_count(tokenizer: Tokenizer, tokens: int) -> None:
    texts = ExactLengthTexts(tokenizer, seed=tokens)
    for _ in range(5):
        ids = texts.make_query(tokens)
        assert len(ids) == tokens
        text = texts.text_of(ids)
        assert tokenizer.encode(text).ids == ids.tolist()  # the server will see exactly these ids


def test_texts_differ_so_that_a_cache_cannot_answer(tokenizer: Tokenizer) -> None:
    texts = ExactLengthTexts(tokenizer)
    made = {texts.text_of(texts.make_query(20)) for _ in range(50)}
    assert len(made) == 50


def test_too_short_a_query_is_refused(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="at least 3 tokens"):
        ExactLengthTexts(tokenizer).make_query(2)


def test_submitter_posts_texts_and_turns_429_into_a_miss(sim_server_factory, tokenizer: Tokenizer) -> None:
    server = sim_server_factory("--limit", "3", "--per-query", "0.3")  # all 5 overlap
    texts = ExactLengthTexts(tokenizer)

    async def body():
        async with ClientPerRequest() as clients:
            info = await server_info(clients, server.url)
            submit = http_submitter(clients, server.url, texts.text_of)
            await submit([texts.make_query(10)])  # answered: no exception
            outcomes = await run_round(submit, [texts.make_query(10) for _ in range(5)])
            missing = await server_info(clients, server.url + "/nowhere")
            return info, outcomes, missing

    info, outcomes, missing = asyncio.run(body())
    assert info["model"]["revision"] == "sim-rev-1"
    assert missing == {}
    refused = [error for _, error in outcomes if error is not None]
    assert len(refused) == 2 and all("ServerRefused: HTTP 429" in error for error in refused)
    assert sum(1 for latency, error in outcomes if error is None and latency > 0) == 3


def test_each_request_in_flight_has_its_own_client_and_rounds_reuse_them(
    sim_server_factory, tokenizer: Tokenizer
) -> None:
    server = sim_server_factory("--per-query", "0.02")  # the 8 requests of a round overlap
    texts = ExactLengthTexts(tokenizer)

    async def body() -> int:
        async with ClientPerRequest() as clients:
            submit = http_submitter(clients, server.url, texts.text_of)
            for _ in range(3):
                outcomes = await run_round(submit, [texts.make_query(10) for _ in range(8)])
                assert all(error is None for _, error in outcomes), outcomes
            return clients.created

    assert asyncio.run(body()) == 8  # not 1 (one client's pool searched per request), not 24
