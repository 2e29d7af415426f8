"""A running server as a pool: queries become texts of an exact token length, POSTed to /embed.

The profiler speaks token ids (that is what in-process pools take); over HTTP the server
tokenizes, so each query is built as a text that the model's tokenizer turns into exactly
the wanted number of tokens (special tokens included), and the submitter sends that text.
Every text is different, so that an embedding cache cannot answer for the model.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from estimator.raw_http import ConnectionPool, NoAnswer

_WORD = re.compile(r"^[a-z]{3,12}$")
_MARKERS = "\u2581\u0120"  # SentencePiece and byte-level BPE word-start markers
_STOCK = 256  # texts made per encode_batch


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
        self._stock: dict[int, list[np.ndarray]] = {}
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
        stock = self._stock.setdefault(tokens, [])
        if not stock:
            stock.extend(self._make_batch(tokens))
        return stock.pop()

    def _make_batch(self, tokens: int) -> list[np.ndarray]:
        # One encode_batch for a stock of texts: encoding them one by one cost ~0.2-0.5 ms each, half
        # of a deep calibration level's time on a GPU host (outside the clock, but the user waits).
        drafts = [self._random.choices(self._words, k=tokens - self._special) for _ in range(_STOCK)]
        texts = [" ".join(words) for words in drafts]
        made = []
        for words, text, encoding in zip(drafts, texts, self._tokenizer.encode_batch(texts)):
            if len(encoding.ids) == tokens:
                made.append(self._remember_text(np.asarray(encoding.ids, dtype=np.int64), text))
            else:
                made.append(self._fit(words, tokens))
        return made

    def _fit(self, words: list[str], tokens: int) -> np.ndarray:
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


class HttpSubmit:
    """POST {"inputs": text} to the pool's target + /embed, each request in flight on a connection of its
    own (estimator.raw_http: an httpx client per connection was the bottleneck on a GPU host); any status
    >= 400 (429 = BUSY) raises ServerRefused."""

    def __init__(
        self, pool: ConnectionPool, text_of: Callable[[np.ndarray], str], headers: dict[str, str] | None = None
    ) -> None:
        self.pool = pool
        self.text_of = text_of
        self.headers = headers
        # Texts differ within a run, not across runs (a calibration's texts come from a fixed seed):
        # a second run against the same server was answered from its embedding cache, and set a
        # depth from cache hits. The model computes every query, and the cache keeps none of them.
        self._embed_headers = {**(headers or {}), "Cache-Control": "no-cache, no-store"}
        self._greeting = pool.target.request("GET", "/health", headers=headers)

    async def prepare(self, concurrency: int) -> None:
        """Open, before the clock, the connections a round of `concurrency` requests will take."""
        self.pool.keep(await self.pool.connections(concurrency, self._greeting))

    async def __call__(self, sequences: Sequence[np.ndarray]) -> bytes:
        texts = [self.text_of(sequence) for sequence in sequences]
        body = json.dumps({"inputs": texts[0] if len(texts) == 1 else texts}).encode()
        request = self.pool.target.request("POST", "/embed", body, self._embed_headers)
        status, answer = await self.pool.exchange(request)
        if status == 429:
            raise ServerRefused("HTTP 429: the server is busy (its queues are full)")
        if status >= 400:
            raise ServerRefused(f"HTTP {status}: {answer[:200].decode(errors='replace')}")
        return answer


async def server_info(
    pool: ConnectionPool, headers: dict[str, str] | None = None, timeout: float | None = 30.0
) -> dict[str, Any]:
    """The server's GET /info as a dict; {} if it has none, answers badly or not within `timeout` s."""
    try:
        request = pool.target.request("GET", "/info", headers=headers)
        status, answer = await asyncio.wait_for(pool.exchange(request), timeout)
        info = json.loads(answer) if status == 200 else {}
    except (NoAnswer, ValueError, TimeoutError):
        return {}
    return info if isinstance(info, dict) else {}
