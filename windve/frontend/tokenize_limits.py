"""/tokenize and /decode within bounds. /tokenize's answer grows with the tokens (about 70 bytes of
JSON, and some hundreds of bytes while built, per token), so tokens are counted before the answer is
built, a request past `max_tokenize_tokens` is refused (413), and the answers a process builds at
once are bounded in tokens (429 past it). /decode takes at most `max_tokenize_tokens` ids. The work
runs off the event loop, which serves the embedding queues.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import orjson

from windve.frontend.errors import OVERLOADED, TOO_LARGE, VALIDATION, ApiError
from windve.frontend.pipeline import too_many_inputs
from windve.frontend.schemas import DecodeRequest, parse
from windve.tokenizer import TextTokenizer

# Answers of this many requests at the limit may be built at once; one at the limit always fits.
BUDGET_REQUESTS = 2


class TokenBudget:
    """Tokens of the answers being built at once; a request that would pass the budget gets a 429.

    Only the event loop touches it, so a plain counter suffices.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0

    @contextmanager
    def hold(self, tokens: int) -> Iterator[None]:
        if self.in_use and self.in_use + tokens > self.capacity:
            raise ApiError(
                429, "too many /tokenize requests at once on this replica; retry shortly", OVERLOADED, retry_after=1
            )
        self.in_use += tokens
        try:
            yield
        finally:
            self.in_use -= tokens


def too_many_tokens(limit: int) -> ApiError:
    return ApiError(
        413,
        f"inputs have more than {limit} tokens, the most /tokenize answers (setting max_tokenize_tokens); "
        "send fewer or shorter texts",
        TOO_LARGE,
        param="inputs",
    )


async def tokenize_within_limits(
    tokenizer: TextTokenizer, texts: Sequence[str], add_special_tokens: bool, limit: int, budget: TokenBudget
) -> bytes:
    """TEI's /tokenize answer as JSON bytes; 413 past `limit` tokens, 429 past the budget."""
    counted = await asyncio.to_thread(tokenizer.count_tokens, texts, add_special_tokens, limit)
    if counted > limit:
        raise too_many_tokens(limit)
    with budget.hold(counted):
        return await asyncio.to_thread(_answer, tokenizer, texts, add_special_tokens, limit)


def _answer(tokenizer: TextTokenizer, texts: Sequence[str], add_special_tokens: bool, limit: int) -> bytes:
    rows = tokenizer.tokens(texts, add_special_tokens)
    # The count cuts long texts into pieces, which can differ from the whole by a token per cut.
    if sum(len(row) for row in rows) > limit:
        raise too_many_tokens(limit)
    return orjson.dumps(rows)


async def decode_within_limits(tokenizer: TextTokenizer, data: object, limit: int, batch_limit: int) -> bytes:
    """TEI's /decode answer to the JSON body `data` as JSON bytes: 413 past `limit` ids or
    `batch_limit` sequences, 422 for an id the model does not have."""
    # Off the loop: a body at the size limit holds ~500,000 ids to check.
    return await asyncio.to_thread(_decoded, tokenizer, data, limit, batch_limit)


def _decoded(tokenizer: TextTokenizer, data: object, limit: int, batch_limit: int) -> bytes:
    ids = data.get("ids") if isinstance(data, dict) else None
    if isinstance(ids, list):  # counted before the items are checked one by one
        nested = bool(ids) and isinstance(ids[0], list)
        if nested and len(ids) > batch_limit:
            raise too_many_inputs(len(ids), batch_limit, "ids")
        total = sum(len(item) if isinstance(item, list) else 1 for item in ids) if nested else len(ids)
        if total > limit:
            raise ApiError(
                413,
                f"ids hold {total} token ids, more than {limit} (setting max_tokenize_tokens); send fewer",
                TOO_LARGE,
                param="ids",
            )
    body = parse(DecodeRequest, data)
    for index, sequence in enumerate(body.sequences):
        inner = tokenizer.past_vocabulary(sequence)
        if inner is not None:
            vocabulary = tokenizer.vocabulary_size
            where = f"[{inner}]" if not isinstance(body.ids[0], list) else f"[{index}][{inner}]"
            raise ApiError(
                422,
                f"ids{where} is {sequence[inner]}, past this model's vocabulary ({vocabulary} tokens: 0 to "
                f"{vocabulary - 1})",
                VALIDATION,
                param="ids",
            )
    return orjson.dumps(tokenizer.decode(body.sequences, body.skip_special_tokens))
