"""A running server as a pool: exact-length texts and the HTTP submitter, over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
from tokenizers import Tokenizer

from estimator.http_pool import ExactLengthTexts, HttpSubmit, server_info
from estimator.raw_http import ConnectionPool, Target
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
        connections = ConnectionPool(Target.from_url(server.url))
        elsewhere = ConnectionPool(Target.from_url(server.url + "/nowhere"))
        try:
            info = await server_info(connections)
            submit = HttpSubmit(connections, texts.text_of)
            await submit([texts.make_query(10)])  # answered: no exception
            outcomes = await run_round(submit, [texts.make_query(10) for _ in range(5)])
            missing = await server_info(elsewhere)
            return info, outcomes, missing
        finally:
            connections.close()
            elsewhere.close()

    info, outcomes, missing = asyncio.run(body())
    assert info["model"]["revision"] == "sim-rev-1"
    assert missing == {}
    refused = [error for _, error in outcomes if error is not None]
    assert len(refused) == 2 and all("ServerRefused: HTTP 429" in error for error in refused)
    assert sum(1 for latency, error in outcomes if error is None and latency > 0) == 3


def test_each_request_in_flight_has_its_own_connection_and_rounds_reuse_them(
    sim_server_factory, tokenizer: Tokenizer
) -> None:
    server = sim_server_factory("--per-query", "0.02")  # the 8 requests of a round overlap
    texts = ExactLengthTexts(tokenizer)

    async def body() -> int:
        connections = ConnectionPool(Target.from_url(server.url))
        try:
            submit = HttpSubmit(connections, texts.text_of)
            for _ in range(3):
                outcomes = await run_round(submit, [texts.make_query(10) for _ in range(8)])
                assert all(error is None for _, error in outcomes), outcomes
            return connections.opened
        finally:
            connections.close()

    assert asyncio.run(body()) == 8  # not 1 (requests queued in the client), not 24


async def _answer_each_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_request: Callable[[bytes], Awaitable[None]]
) -> None:
    """A raw HTTP/1.1 server's connection: each request read whole, `on_request(head)`, then 200 "[]"."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            await on_request(head)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def test_a_round_opens_its_connections_before_the_clock(tokenizer: Tokenizer) -> None:
    """A server that takes a new connection late (a busy loop's accept) delays only the greeting, not
    the round's requests: a jump to many more clients must not time their connects."""
    late_accept = 2.0
    greeted: list[bytes] = []

    async def on_request(head: bytes) -> None:
        greeted.append(head.split(b" ")[1])

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(late_accept)
        await _answer_each_request(reader, writer, on_request)

    async def body() -> tuple[list[tuple[float, str | None]], int]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        connections = ConnectionPool(Target("127.0.0.1", server.sockets[0].getsockname()[1]))
        try:
            texts = ExactLengthTexts(tokenizer)
            outcomes = await run_round(HttpSubmit(connections, texts.text_of), [texts.make_query(10) for _ in range(4)])
            return outcomes, connections.opened
        finally:
            connections.close()
            server.close()

    outcomes, opened = asyncio.run(body())
    assert opened == 4 and greeted[:4] == [b"/health"] * 4 and greeted[4:] == [b"/embed"] * 4
    assert all(error is None and latency < late_accept for latency, error in outcomes), outcomes


def test_a_round_smaller_than_the_pool_takes_connections_from_all_of_it(tokenizer: Tokenizer) -> None:
    """Two "front ends": the server answers on every other connection it accepts 50 ms late. After a
    round of 64 the pool holds its connections in the order their answers came; a round of 16 that
    took them in that order sent all 16 to one "front end" (checked: LIFO order, 16 of 16 on the
    fast half). A random choice does that with a chance of about 2e-6."""
    late: dict[int, bool] = {}
    seen: list[bool] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        slow = len(late) % 2 == 1
        late[id(writer)] = slow

        async def on_request(head: bytes) -> None:
            if head.startswith(b"POST"):
                seen.append(slow)
                await asyncio.sleep(0.05 if slow else 0.0)

        await _answer_each_request(reader, writer, on_request)

    async def body() -> int:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        connections = ConnectionPool(Target("127.0.0.1", server.sockets[0].getsockname()[1]))
        try:
            texts = ExactLengthTexts(tokenizer)
            submit = HttpSubmit(connections, texts.text_of)
            for clients in (64, 16):
                outcomes = await run_round(submit, [texts.make_query(10) for _ in range(clients)])
                assert all(error is None for _, error in outcomes), outcomes
            return connections.opened
        finally:
            connections.close()
            server.close()

    assert asyncio.run(body()) == 64 and sum(late.values()) == 32
    second = seen[64:]
    assert len(second) == 16 and 0 < sum(second) < 16, second


def test_a_request_timed_out_mid_answer_closes_its_connection(sim_server_factory, tokenizer: Tokenizer) -> None:
    server = sim_server_factory("--per-query", "0.5")
    texts = ExactLengthTexts(tokenizer)

    async def body() -> tuple[str | None, str | None, int]:
        connections = ConnectionPool(Target.from_url(server.url))
        try:
            submit = HttpSubmit(connections, texts.text_of)
            (late,) = await run_round(submit, [texts.make_query(10)], timeout=0.05)
            (answered,) = await run_round(submit, [texts.make_query(10)], timeout=30)
            return late[1], answered[1], connections.opened
        finally:
            connections.close()

    late, answered, opened = asyncio.run(body())
    assert late is not None and "TimeoutError" in late
    # The late answer still on its way must not be read as the next request's: a new connection asks.
    assert answered is None and opened == 2


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("http://127.0.0.1:8080", Target("127.0.0.1", 8080)),
        ("http://127.0.0.1:8080/", Target("127.0.0.1", 8080)),
        ("https://embed.example/v1/", Target("embed.example", 443, "/v1", tls=True)),
        ("http://[::1]:9000", Target("::1", 9000)),
    ],
)
def test_urls_name_a_target(url: str, target: Target) -> None:
    assert Target.from_url(url) == target


def test_a_request_is_encoded_with_its_prefix_host_and_length() -> None:
    request = Target("::1", 9000, "/v1").request("POST", "/embed", b'{"inputs": "a"}', {"Authorization": "Bearer k"})
    head, _, body = request.partition(b"\r\n\r\n")
    assert head.split(b"\r\n") == [
        b"POST /v1/embed HTTP/1.1", b"Host: [::1]:9000", b"Content-Type: application/json", b"Content-Length: 15",
        b"Authorization: Bearer k",
    ]
    assert body == b'{"inputs": "a"}'


def test_an_unusable_url_is_refused() -> None:
    with pytest.raises(ValueError, match="not an http"):
        Target.from_url("redis://127.0.0.1:6379")


def test_a_server_that_never_answers_info_gives_no_info_in_time() -> None:
    async def body() -> tuple[dict, int]:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # reads the request, answers nothing, until the client hangs up
            writer.close()

        server = await asyncio.start_server(hold, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connections = ConnectionPool(Target("127.0.0.1", port))
        try:
            return await server_info(connections, timeout=0.2), connections.opened
        finally:
            connections.close()
            server.close()

    info, opened = asyncio.run(body())
    assert info == {} and opened == 1



def test_profile_queries_ask_the_model_not_the_cache() -> None:
    """A calibration's texts come from a fixed seed: run again against the same server, they were
    answered from its embedding cache, and the depth was set from cache hits. Each POST says
    `Cache-Control: no-cache, no-store` (the service computes it afresh and keeps nothing of it;
    tests/redis/test_cache_http.py has the service's side)."""
    heads: list[bytes] = []

    async def body() -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while head := await reader.readuntil(b"\r\n\r\n"):
                heads.append(head)
                length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), b"0"))  # fmt: skip
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]")
                await writer.drain()

        listener = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        connections = ConnectionPool(Target.from_url(f"http://127.0.0.1:{port}"))
        try:
            submit = HttpSubmit(connections, lambda ids: "a text", headers={"Authorization": "Bearer k"})
            await submit([np.array([1, 2, 3])])
        finally:
            connections.close()
            listener.close()

    asyncio.run(body())
    (post,) = [head for head in heads if head.startswith(b"POST /embed ")]
    assert b"\r\nCache-Control: no-cache, no-store\r\n" in post and b"\r\nAuthorization: Bearer k\r\n" in post
