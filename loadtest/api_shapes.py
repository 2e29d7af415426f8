"""Request bodies and response checks for the two embedding API shapes a server may speak.

TEI (`POST /embed`, also WindVE's) answers `[[float]]`; OpenAI (`POST /v1/embeddings`, also
Infinity's and WindVE's) answers `{"data": [{"index", "embedding"}]}`. A response only counts
as served when it holds one finite, non-empty vector per text, all of one dimension.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from loadtest.workload import Workload


class NotAnEmbedding(ValueError):
    """A 200 answer that does not hold the embeddings asked for."""


def request_body(workload: Workload, texts: list[str]) -> dict[str, Any]:
    if workload.api == "openai":
        return {"input": texts, "model": workload.model}
    # truncate=false: a text longer than the model allows must fail loudly, not shrink silently.
    return {"inputs": texts, "normalize": True, "truncate": False}


def embedding_dimension(workload: Workload, content: bytes, expected: int) -> int:
    """The vectors' dimension; raises NotAnEmbedding saying what is wrong with the answer."""
    try:
        payload = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise NotAnEmbedding(f"answer is not JSON: {exc}") from None
    vectors = _tei_vectors(payload) if workload.api == "tei" else _openai_vectors(payload)
    if len(vectors) != expected:
        raise NotAnEmbedding(f"{len(vectors)} embeddings for {expected} texts")
    dims = {len(vector) if isinstance(vector, list) else -1 for vector in vectors}
    if len(dims) != 1 or min(dims) < 1:
        raise NotAnEmbedding(f"embeddings are not equal-length non-empty lists (lengths {sorted(dims)})")
    for vector in vectors:
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in vector):
            raise NotAnEmbedding("an embedding holds a non-number or a non-finite value")
    return dims.pop()


def _tei_vectors(payload: Any) -> list[Any]:
    if not isinstance(payload, list):
        raise NotAnEmbedding(f"expected a JSON list of embeddings (TEI shape), got {type(payload).__name__}")
    return payload


def _openai_vectors(payload: Any) -> list[Any]:
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise NotAnEmbedding("expected {'data': [{'index', 'embedding'}, ...]} (OpenAI shape)")
    ordered = sorted(data, key=lambda item: item.get("index", 0))
    return [item.get("embedding") for item in ordered]
