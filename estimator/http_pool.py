"""A running server as a pool: queries become texts of an exact token length, POSTed to /embed.

The profiler speaks token ids (that is what in-process pools take); over HTTP the server
tokenizes, so each query is built as a text that the model's tokenizer turns into exactly
the wanted number of tokens (special tokens included), and the submitter sends that text.
Every text is different, so that an embedding cache cannot answer for the model.
"""

from __future__ import annotations

import random
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
from tokenizers import Tokenizer

from estimator.rounds import Submit

_WORD = re.compile(r"^[a-z]{3,12}$")
_MARKERS = "\u2581\u0120"  # SentencePiece and byte-level BPE word-start markers


class ServerRefused(RuntimeError):
    """The server answered with an error status (429 = BUSY); the request is a miss."""


class ExactLengthTexts:
    """Random texts of exactly N tokens for one tokenizer, and the text behind given ids."""

    def __init__(self, tokenizer: Tokenizer, seed: int = 0, remember: int = 200_000) -> None:
        self._tokenizer = Tokenizer.from_str(tokenizer.to_str())  # a copy: padding/truncation off
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._random = random.Random(seed)
        self._texts: OrderedDict[bytes, str] = OrderedDict()
        self._remember = remember
        self._special = len(self._tokenizer.encode("").ids)
        self._words = self._single_token_words()
        if not self._words:
            raise ValueError("the tokenizer has no plain lower-case words that are single tokens")

    def _single_token_words(self) -> list[str]:
        candidates = sorted(
            {token.lstrip(_MARKERS) for token in self._tokenizer.get_vocab() if _WORD.match(token.lstrip(_MARKERS))}
        )
        encoded = self._tokenizer.encode_batch([" " + word for word in candidates], add_special_tokens=False)
        return [word for word, enc in zip(candidates, encoded) if len(enc.ids) == 1]

    @property
    def minimum_tokens(self) -> int:
        return self._special + 1

    def make_query(self, tokens: int) -> np.ndarray:
        """Token ids of a fresh random text of exactly `tokens` tokens (special tokens included)."""
        if tokens < self.minimum_tokens:
            raise ValueError(f"queries need at least {self.minimum_tokens} tokens with this tokenizer, got {tokens}")
        words = self._random.choices(self._words, k=tokens - self._special)
        for _ in range(16):  # single-token words almost always add up exactly; fix up the rest
            text = " ".join(words)
            ids = self._tokenizer.encode(text).ids
            if len(ids) == tokens:
                return self._remember_text(np.asarray(ids, dtype=np.int64), text)
            if len(ids) > tokens and len(words) > 1:
                words.pop()
            else:
                words.append(self._random.choice(self._words))
        raise ValueError(f"could not build a text of exactly {tokens} tokens with this tokenizer")

    def _remember_text(self, ids: np.ndarray, text: str) -> np.ndarray:
        self._texts[ids.tobytes()] = text
        while len(self._texts) > self._remember:
            self._texts.popitem(last=False)
        return ids

    def text_of(self, ids: np.ndarray) -> str:
        """The text a query made here came from (its ids are what the server will see)."""
        try:
            return self._texts[np.asarray(ids, dtype=np.int64).tobytes()]
        except KeyError:
            return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


class ClientPerRequest:
    """httpx clients of one connection each, one lent to every request in flight, kept and lent again.

    One client holding C connections searches its pool on every request, at a CPU cost that grows with
    C, spent on the cores the server shares when both run on one host: it was timed as server latency
    (figures: bench/ESTIMATOR.md, "The HTTP client").
    """

    def __init__(self, **client_options: Any) -> None:
        # Each client would load the CA certificates again, inside the timed round that first needs
        # it; one context, verifying as httpx does by default, serves them all.
        self._options = {"verify": httpx.create_ssl_context(), **client_options}
        self._idle: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []

    @property
    def created(self) -> int:
        return len(self._all)

    @asynccontextmanager
    async def lend(self) -> AsyncIterator[httpx.AsyncClient]:
        if self._idle:
            client = self._idle.pop()
        else:
            client = httpx.AsyncClient(**self._options)
            self._all.append(client)
        try:
            yield client
        finally:
            self._idle.append(client)

    async def aclose(self) -> None:
        for client in self._all:
            await client.aclose()
        self._all.clear()
        self._idle.clear()

    async def __aenter__(self) -> ClientPerRequest:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def http_submitter(clients: ClientPerRequest, base_url: str, text_of: Callable[[np.ndarray], str]) -> Submit:
    """POST {"inputs": text} to base_url/embed; any status >= 400 (429 = BUSY) raises ServerRefused."""
    endpoint = base_url.rstrip("/") + "/embed"

    async def submit(sequences: Sequence[np.ndarray]) -> Any:
        texts = [text_of(sequence) for sequence in sequences]
        async with clients.lend() as client:
            response = await client.post(endpoint, json={"inputs": texts[0] if len(texts) == 1 else texts})
        if response.status_code == 429:
            raise ServerRefused("HTTP 429: the server is busy (its queues are full)")
        if response.status_code >= 400:
            raise ServerRefused(f"HTTP {response.status_code}: {response.text[:200]}")
        return response.content

    return submit


async def server_info(clients: ClientPerRequest, base_url: str) -> dict[str, Any]:
    """The server's GET /info as a dict; {} if it has none or answers badly."""
    try:
        async with clients.lend() as client:
            response = await client.get(base_url.rstrip("/") + "/info")
        info = response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}
