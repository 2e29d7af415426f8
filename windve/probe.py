"""The warm-up probe over HTTP: a pool's starting depth, timed on the path that serves.

The rounds are `windve.depths.probe_rounds`'; each query is a `POST /embed` of one text of
PROBE_TOKENS tokens to the service's own listening address on loopback, so alpha and beta include
what a client waits for besides the engines: reading and validating the request, tokenizing,
dispatch, and writing the JSON answer. (Timed below the front end, the probe set depths 4x too
deep on a GPU host: issue #29.) Every text is different, and each request says `Cache-Control:
no-cache, no-store`: the embedding cache neither answers nor keeps them.

Which process runs it: with one front end, that front end's own process, once uvicorn listens
(`Listening`); with several, the `windve serve` parent (the dispatcher), once every front end has
said it serves. The front end admits the probe's requests like any other; the runtime pins them to
the probed pool by giving the other pools no room meanwhile (`Runtime._pinned`).

The client is estimator.raw_http's: one kept-alive connection per query in flight, opened before the
round, and each request encoded before the clock starts. It runs on the same event loop as the
front end (one process) or the dispatcher (several), so whatever it costs is timed as service
latency; that module says what it costs. A client's connection fails the round at the first
answer other than 200; the round still waits for every other client to end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from estimator.raw_http import Connection, ConnectionPool, NoAnswer, Target
from windve.depths import PROBE_TOKENS, WARM_UP_HEADER, DepthSource, probe_rounds

Address = tuple[str, int]


class ProbeFailed(RuntimeError):
    """The HTTP probe got no answer, or an answer other than 200: the caller probes in-process."""


class Listening:
    """Where this process's HTTP server listens, once it does (set by the one-process `windve serve`)."""

    def __init__(self) -> None:
        self.address: Address | None = None
        self._bound = asyncio.Event()  # binds to the server's loop on first use

    def bound(self, sockname: tuple) -> None:
        self.address = loopback(sockname)
        self._bound.set()

    async def wait(self) -> Address:
        await self._bound.wait()
        assert self.address is not None
        return self.address


def loopback(sockname: tuple) -> Address:
    """Where this host reaches a server listening at `sockname`: a wildcard address on loopback."""
    host, port = sockname[0], sockname[1]
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host), port


async def probe_over_http(
    pool: str,
    address: Address,
    make_text: Callable[[], str],
    batch: int,
    slo: float,
    api_key: str | None = None,
) -> DepthSource:
    """`probe_rounds` through the service's front end at `address`; raises ProbeFailed.

    `make_text()` gives a new text of PROBE_TOKENS tokens at each call. The caller makes sure
    that the front end admits these requests to `pool` and to no other.
    """
    # As many as probe_rounds asks for; each round encodes its requests before its clock starts.
    target = Target(*address)
    client = _Client(target, (_request(target, make_text(), api_key) for _ in itertools.count()),
                     greeting=target.request("GET", "/health"))
    try:
        return await probe_rounds(pool, client.closed_loop, batch, slo, "http", PROBE_TOKENS)
    finally:
        client.close()


def exact_length_texts(model_path: Path, tokens: int = PROBE_TOKENS) -> Callable[[], str]:
    """A maker of random texts that the model's tokenizer turns into exactly `tokens` ids.

    Seeded afresh at each start: replicas sharing a Redis cache must not send each other's texts."""
    from estimator.http_pool import ExactLengthTexts
    from windve.tokenizer import load_fast_tokenizer

    texts = ExactLengthTexts(load_fast_tokenizer(model_path), seed=secrets.randbits(64))
    return lambda: texts.text_of(texts.make_query(tokens))


def _request(target: Target, text: str, api_key: str | None) -> bytes:
    # Random texts: nothing to find, nothing worth keeping in the cache.
    headers = {"Cache-Control": "no-cache, no-store", WARM_UP_HEADER: "1"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return target.request("POST", "/embed", json.dumps({"inputs": text}).encode(), headers)


class _Client:
    """Closed-loop rounds of POSTs, each client on a kept-alive connection of its own."""

    def __init__(self, target: Target, requests: Iterator[bytes], greeting: bytes | None = None) -> None:
        self.pool = ConnectionPool(target)
        self.requests = requests
        self.greeting = greeting  # sent once on each new connection, so that no accept is timed

    async def closed_loop(self, clients: int, queries: int) -> list[float]:
        """`clients` connections, each posting `queries` requests back to back; every answer's latency,
        in the order the answers came."""
        # The texts first, off the loop (hundreds of exact-length texts take the tokenizer a while,
        # and with several front ends this loop is the dispatcher's). Made after the connections
        # were taken, on a loaded host they took longer than a front end keeps an idle connection
        # (5 s): the round's first requests met closed connections, and the probe fell back to
        # in-process timings, which left out HTTP and set a depth 10x too deep.
        requests = await asyncio.to_thread(
            lambda: [[next(self.requests) for _ in range(queries)] for _ in range(clients)]
        )
        try:
            connections = await self.pool.connections(clients, self.greeting)  # before the clock
        except NoAnswer as error:
            raise ProbeFailed(str(error)) from None
        try:
            answered = await self._round(connections, requests)
        except BaseException:  # failed or cancelled: a connection may hold half an answer
            for connection in connections:
                connection.close()
            raise
        self.pool.keep(connections)
        return answered

    async def _round(self, connections: list[Connection], requests: list[list[bytes]]) -> list[float]:
        answered: list[float] = []

        async def client(connection: Connection, own: list[bytes]) -> None:
            for request in own:
                started = time.perf_counter()
                try:
                    status, body = await connection.exchange(request)
                except NoAnswer as error:  # closed_loop closes a failed round's connections
                    raise ProbeFailed(f"no answer from the front end: {error}") from None
                answered.append(time.perf_counter() - started)
                if status != 200:
                    raise ProbeFailed(f"the front end answered {status}: {body[:200].decode(errors='replace')}")

        # Every request ends (answered or failed) before the round does: no stray reads are left.
        outcomes = await asyncio.gather(*map(client, connections, requests), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return answered

    def close(self) -> None:
        self.pool.close()
