"""The request path both APIs share: validate -> cache -> room check -> tokenize -> submit -> normalize."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
from starlette.requests import Request

from queue_manager.protocol import Busy, QueryFailed, ShuttingDown
from windve.cache import EmbeddingCache, cache_keys
from windve.frontend import metrics
from windve.frontend.errors import BACKEND, OVERLOADED, TOO_LARGE, UNHEALTHY, VALIDATION, ApiError
from windve.service import Runtime
from windve.tokenizer import InputTooLong


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


class EmbeddingPipeline:
    def __init__(self, runtime: Runtime, cache: EmbeddingCache | None = None) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.cache = cache

    def check_inputs(self, texts: Sequence[str], field: str) -> None:
        if not texts:
            raise ApiError(422, f"{field} must not be empty", VALIDATION, param=field)
        limit = self.settings.max_client_batch_size
        if len(texts) > limit:
            raise ApiError(
                413,
                f"batch size {len(texts)} > maximum allowed batch size {limit}",
                TOO_LARGE,
                param=field,
            )
        for index, text in enumerate(texts):
            if not text:
                raise ApiError(422, f"{field}[{index}] is an empty string", VALIDATION, param=field)

    async def embed(
        self, texts: Sequence[str], normalize: bool, truncate: bool | None, request: Request, field: str
    ) -> tuple[np.ndarray, int]:
        """Embeddings [len(texts), dim] and the number of tokens embedded."""
        self.check_inputs(texts, field)
        runtime = self.runtime
        if not runtime.ready:
            raise ApiError(503, "the model is still loading; retry shortly", UNHEALTHY, retry_after=1)
        truncate = self.settings.truncate if truncate is None else truncate
        keys = self._cache_keys(texts, normalize, truncate)
        vectors, missing = await self._cached(keys, len(texts))
        if missing:
            # Full queues refuse before the tokenizer runs, as TEI takes its permit first.
            try:
                runtime.queue_manager.check_room(len(missing))
            except Busy as exc:
                raise refusal(exc) from None
        try:
            sequences = runtime.tokenizer.encode(texts, truncate)  # all of them: usage counts every token
        except InputTooLong as exc:
            raise ApiError(422, f"{field}[{exc.index}]: {exc}", VALIDATION, param=field) from None
        tokens = sum(len(seq) for seq in sequences)
        if missing:
            fresh = await self._submit([sequences[i] for i in missing], request)
            if normalize:
                fresh = normalized(fresh)
            if vectors is None:
                vectors = fresh
            else:
                vectors[missing] = fresh
            if keys is not None:
                await self.cache.put_many([keys[i] for i in missing], fresh)
        metrics.TOKENS.inc(tokens)
        metrics.INPUTS.inc(len(texts))
        return vectors, tokens

    def _cache_keys(self, texts: Sequence[str], normalize: bool, truncate: bool) -> list[bytes] | None:
        if self.cache is None:
            return None
        spec = self.runtime.spec
        # A lower input cap truncates differently: it is part of what produced the vector.
        revision = spec.revision if self.settings.max_input_tokens is None else (
            f"{spec.revision}-max{self.runtime.tokenizer.max_tokens}"
        )
        return cache_keys(spec.name, revision, normalize, truncate, texts)

    async def _cached(self, keys: list[bytes] | None, n: int) -> tuple[np.ndarray | None, list[int]]:
        if keys is None:
            return None, list(range(n))
        found = await self.cache.get_many(keys)
        missing = [i for i, vector in enumerate(found) if vector is None]
        if len(missing) == n:
            return None, missing
        vectors = np.empty((n, self.runtime.spec.dim), dtype=np.float32)
        for i, vector in enumerate(found):
            if vector is not None:
                vectors[i] = vector
        return vectors, missing

    async def _submit(self, sequences: list[np.ndarray], request: Request) -> np.ndarray:
        qm = self.runtime.queue_manager
        # Admitted in this same step of the event loop as the room check: a request refused
        # here costs no task, and no other request can take the room in between.
        try:
            admitted = qm.admit(sequences)
        except Busy as exc:
            raise refusal(exc) from None
        watch = asyncio.ensure_future(_until_disconnect(request))
        try:
            await asyncio.wait((admitted.future, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not admitted.future.done():  # the client left, or this handler was cancelled
                qm.cancel(admitted)
        if not admitted.future.done():
            raise ClientGone()
        try:
            return admitted.future.result()
        except QueryFailed as exc:
            raise ApiError(503, f"inference failed: {exc}", BACKEND, retry_after=1) from None


def refusal(exc: Busy) -> ApiError:
    """The 429 for a request the queues refused (ShuttingDown is a Busy too)."""
    if isinstance(exc, ShuttingDown):
        message = "the service is shutting down; retry on another replica"
    else:
        message = "model is overloaded: every queue is full"
    return ApiError(429, message, OVERLOADED, retry_after=exc.retry_after)


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def normalized(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)
