"""The request path both APIs share: validate -> cache -> room check -> tokenize the misses -> dispatch -> normalize.

Tokenizing a large request runs off the event loop, so /health and small requests never wait
behind it; a small one is tokenized in place (a thread hop would cost more than the work).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from starlette.requests import Request
from starlette.types import Scope

from queue_manager.protocol import Busy, QueryFailed, ShuttingDown, Unavailable
from windve.cache import EmbeddingCache, cache_keys
from windve.depths import WARM_UP_HEADER
from windve.frontend import metrics
from windve.frontend.context import FrontEnd
from windve.frontend.errors import BACKEND, OVERLOADED, TOO_LARGE, UNHEALTHY, VALIDATION, ApiError
from windve.prompts import default_prompt, prompt_text
from windve.tokenizer import InputTooLong, NotInVocabulary

INLINE_TOKENIZE_CHARS = 16_384  # below this many characters (or token ids) a request is tokenized on the loop
Input = str | list[int]  # a text, or the model's token ids of one (TEI's /embed takes either)
ARRIVED = "windve.arrived"  # scope key: time.perf_counter() when the request's bytes arrived (event_loop.py)
GATE_PASS = "windve.gate_pass"  # scope key: the overload gate's pass of a request it let through (gate.py)
BUSY_ANSWERED = "windve.busy_answered"  # scope key: answered BUSY (the HTTP protocol parks the connection)
LANE_WAIT = "windve.lane_wait"  # scope key: the request waited in its socket in the slow lane (slow_lane.py)
CLOSE = {"Connection": "close"}  # an answer's header: the connection closes after it


def too_many_inputs(count: int, limit: int, field: str) -> ApiError:
    """A request of more inputs than `max_client_batch_size` (`limit`): TEI's 413 and its words."""
    return ApiError(413, f"batch size {count} > maximum allowed batch size {limit}", TOO_LARGE, param=field)


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


class Embedded(NamedTuple):
    """A request's embeddings, the tokens embedded (the prompt's included), and what its TEI
    timing headers say: seconds tokenizing, and the mean over the inputs computed of their
    seconds in a queue and of their batch's seconds; `served`: the pools that computed them
    ("cache" where none did)."""

    vectors: np.ndarray
    tokens: int
    tokenizing: float
    queued: float
    computed: float
    served: str


class EmbeddingPipeline:
    def __init__(self, runtime: FrontEnd, cache: EmbeddingCache | None = None) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.dispatcher = runtime.dispatcher
        self.cache = cache
        self.default_prompt = default_prompt(runtime.spec, self.settings)

    def check_inputs(self, texts: Sequence[Input], field: str) -> None:
        if not texts:
            raise ApiError(422, f"{field} must not be empty", VALIDATION, param=field)
        limit = self.settings.max_client_batch_size
        if len(texts) > limit:
            raise too_many_inputs(len(texts), limit, field)
        for index, text in enumerate(texts):
            if not text:
                what = "an empty string" if isinstance(text, str) else "an empty list of token ids"
                raise ApiError(422, f"{field}[{index}] is {what}", VALIDATION, param=field)

    def prompted(self, texts: Sequence[Input], prompt_name: str | None) -> Sequence[Input]:
        """`texts` with the prompt `prompt_name` (None: the default one) in front, as
        sentence-transformers' encode puts it; a 422 for a name the model does not have. Token
        ids are the client's own: no prompt goes in front of them."""
        prompt = self.default_prompt if prompt_name is None else self._named_prompt(prompt_name)
        return [prompt + text if isinstance(text, str) else text for text in texts] if prompt else texts

    def _named_prompt(self, name: str) -> str:
        try:
            return prompt_text(self.runtime.spec, name)
        except ValueError as error:
            raise ApiError(422, str(error), VALIDATION, param="prompt_name") from None

    async def embed(
        self,
        texts: Sequence[Input],
        normalize: bool,
        truncate: bool | None,
        request: Request,
        field: str,
        prompt_name: str | None = None,
        side: str | None = None,
    ) -> Embedded:
        """Embeddings [len(texts), dim] and what it took; `side`: where a truncated text is cut
        (None: the model's tokenizer's side)."""
        # From when the request's bytes reached the socket (http_protocol.py takes the kernel's
        # stamp): under load the handler starts a whole event-loop turn or more later, and depth
        # control must count that.
        arrived = arrival(request.scope)
        self.check_inputs(texts, field)
        texts = self.prompted(texts, prompt_name)
        truncate = self.settings.truncate if truncate is None else truncate
        side = self.runtime.spec.truncation_side if side is None else side
        keys = self._cache_keys(texts, normalize, truncate, side)
        use = cache_use(request.headers.get("cache-control"), request.headers.get("pragma", ""))
        vectors, missing, tokens = await self._cached(keys if use.read else None, len(texts))
        release_pass(request.scope)  # this request's own room check, next, counts what it needs
        queued, computed, served, tokenizing = 0.0, 0.0, "cache", 0.0
        sequences: list[np.ndarray] = []
        if missing:
            # Full queues refuse before the tokenizer runs, as TEI takes its permit first.
            try:
                self.dispatcher.check_room(len(missing))
            except (Busy, Unavailable) as exc:
                raise refusal(exc) from None
            # Only the misses: a hit's entry keeps its token count for the usage.
            tokenizing = time.perf_counter()
            sequences = await self._tokenize(texts, missing, truncate, field, side)
            tokenizing = time.perf_counter() - tokenizing
            metrics.TOKENIZATION_TIME.observe(tokenizing)
            tokens += sum(len(seq) for seq in sequences)
        count = counted(request)
        if count:
            metrics.REQUEST_TOKENS.observe(tokens)
        if missing:
            waited = time.perf_counter() - arrived
            if count:
                metrics.FRONT_END_TIME.observe(waited)
            fresh, (queued, computed, served) = await self._submit(sequences, request, waited)
            if normalize:
                fresh = normalized(fresh)
            if vectors is None:
                vectors = fresh
            else:
                vectors[missing] = fresh
            if keys is not None and use.write:
                await self.cache.put_many([keys[i] for i in missing], fresh, [len(seq) for seq in sequences])
        if count:
            metrics.TOKENS.inc(tokens)
            metrics.INPUTS.inc(len(texts))
        return Embedded(vectors, tokens, tokenizing, queued, computed, served)

    async def _tokenize(
        self, inputs: Sequence[Input], wanted: list[int], truncate: bool, field: str, side: str
    ) -> list[np.ndarray]:
        """The token ids of inputs[i] for each i in `wanted`, in that order; a 422 names the input
        by its place in the request."""
        encode = functools.partial(self.runtime.tokenizer.encode, side=side)
        at = [index for index in wanted if isinstance(inputs[index], str)]
        texts: list[str] = [inputs[index] for index in at]  # type: ignore[misc]
        try:
            if not texts:
                sequences = []
            elif sum(len(text) for text in texts) <= INLINE_TOKENIZE_CHARS:
                sequences = encode(texts, truncate)
            else:
                sequences = await asyncio.to_thread(encode, texts, truncate)
        except InputTooLong as exc:
            raise ApiError(422, f"{field}[{at[exc.index]}]: {exc.at(at[exc.index])}", VALIDATION, param=field) from None
        if len(at) < len(wanted):
            with_ids = functools.partial(self._with_token_ids, inputs, wanted, sequences, truncate, side, field)
            ids = sum(len(inputs[index]) for index in wanted if not isinstance(inputs[index], str))
            sequences = with_ids() if ids <= INLINE_TOKENIZE_CHARS else await asyncio.to_thread(with_ids)
        return sequences

    def _with_token_ids(
        self, inputs: Sequence[Input], wanted: list[int], encoded: list[np.ndarray], truncate: bool, side: str,
        field: str,
    ) -> list[np.ndarray]:
        """The sequences of inputs[i] for i in `wanted`: `encoded` for its texts, and its token ids as sent."""
        texts = iter(encoded)
        sequences = []
        for index in wanted:
            item = inputs[index]
            if isinstance(item, str):
                sequences.append(next(texts))
                continue
            try:
                sequences.append(self.runtime.tokenizer.sequence_of_ids(item, truncate, side))
            except InputTooLong as exc:
                raise ApiError(422, f"{field}[{index}]: {exc.at(index)}", VALIDATION, param=field) from None
            except NotInVocabulary as exc:
                raise ApiError(422, f"{field}[{index}]: {exc}", VALIDATION, param=field) from None
        return sequences

    def _cache_keys(self, texts: Sequence[Input], normalize: bool, truncate: bool, side: str) -> list[bytes] | None:
        if self.cache is None:
            return None
        identity = self._vector_identity
        if truncate and side != self.runtime.spec.truncation_side:
            identity += f"-cut{side}"  # a long text cut at the other end is another vector
        return cache_keys(self.runtime.spec.name, identity, normalize, truncate, texts)

    @functools.cached_property
    def _vector_identity(self) -> str:
        """The cache keys' revision part: what produced a vector besides its text and request
        options. Services that share a Redis share entries only where all of it is the same."""
        spec, settings = self.runtime.spec, self.settings
        identity = f"{spec.revision}-{spec.config_hash}-{settings.engine}-{settings.dtype}"
        # A lower input cap truncates differently: it is part of what produced the vector.
        if settings.max_input_tokens is not None:
            identity += f"-max{self.runtime.tokenizer.max_tokens}"
        return identity

    async def _cached(self, keys: list[bytes] | None, n: int) -> tuple[np.ndarray | None, list[int], int]:
        """The vectors found (None: none was), the indices of the misses, and the hits' tokens."""
        if keys is None:
            return None, list(range(n)), 0
        found = await self.cache.get_many(keys)
        missing = [i for i, entry in enumerate(found) if entry is None]
        if len(missing) == n:
            return None, missing, 0
        vectors = np.empty((n, self.runtime.spec.dim), dtype=np.float32)
        tokens = 0
        for i, entry in enumerate(found):
            if entry is not None:
                vectors[i] = entry.vector
                tokens += entry.tokens
        return vectors, missing, tokens

    async def _submit(
        self, sequences: list[np.ndarray], request: Request, waited: float
    ) -> tuple[np.ndarray, tuple[float, float, str]]:
        """Dispatch the sequences: their vectors and timing (Ticket.timing); the client leaving
        cancels them (their slots free at once).

        Submitted in this same step of the event loop as the room check: in-process, a request
        refused here costs no task, and no other request can take the room in between."""
        try:
            ticket = self.dispatcher.submit(sequences, waited)
        except (Busy, Unavailable) as exc:
            raise refusal(exc) from None
        watch = asyncio.ensure_future(_until_disconnect(request))
        try:
            await asyncio.wait((ticket.future, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not ticket.future.done():  # the client left, or this handler was cancelled
                ticket.cancel()
        if not ticket.future.done():
            raise ClientGone()
        try:
            return ticket.result(), ticket.timing()
        except (Busy, Unavailable) as exc:
            raise refusal(exc) from None
        except QueryFailed as exc:
            raise ApiError(503, f"inference failed: {exc}", BACKEND, retry_after=1) from None


class CacheUse(NamedTuple):
    read: bool
    write: bool


def cache_use(cache_control: str | None, pragma: str = "") -> CacheUse:
    """What a request's `Cache-Control` lets the embedding cache do, as HTTP caches read it:
    `no-cache` or `max-age=0`, answer from the model rather than the cache; `no-store`, keep none
    of these texts or vectors (texts that must not sit in a shared Redis; the warm-up probe's random
    ones). `Pragma: no-cache` (HTTP/1.0) counts as `no-cache` where there is no `Cache-Control`
    (RFC 9111 5.4)."""
    if cache_control is None:
        cache_control = "no-cache" if "no-cache" in pragma.lower() else ""
    directives = {part.strip().lower().replace(" ", "") for part in cache_control.split(",")}
    names = {directive.split("=", 1)[0] for directive in directives}
    fresh = "no-cache" in names or "max-age=0" in directives
    return CacheUse(read=not fresh, write="no-store" not in names)


def arrival(scope: Scope) -> float:
    """time.perf_counter() when the request's bytes arrived, as the HTTP protocol stamped it (now
    where nothing stamped it)."""
    stamp = scope.get(ARRIVED)
    return time.perf_counter() if stamp is None else stamp


def counted(request: Request) -> bool:
    """Whether the request's metrics are the clients': the warm-up probe's are left out."""
    return WARM_UP_HEADER not in request.headers


def release_pass(scope: Scope) -> None:
    """The request of `scope` is at its own room check, or has ended: the gate's pass stops holding room."""
    held = scope.get(GATE_PASS)
    if held is not None:
        held.release()


def refusal(exc: Busy | Unavailable) -> ApiError:
    """429 for a request the queues refused (ShuttingDown is a Busy too); 503 when no engine can serve."""
    if isinstance(exc, Unavailable):
        return ApiError(503, str(exc), UNHEALTHY, retry_after=exc.retry_after)
    if isinstance(exc, ShuttingDown):
        # The connection closes with it: a client that keeps it would ask this replica again,
        # which refuses everything from now on, instead of reconnecting to one that serves.
        message = "the service is shutting down; retry on another replica"
        return ApiError(429, message, OVERLOADED, retry_after=exc.retry_after, headers=CLOSE)
    return ApiError(429, "model is overloaded: every queue is full", OVERLOADED, retry_after=exc.retry_after)


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def normalized(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)
