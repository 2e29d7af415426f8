"""Cache keys: one per (model, revision, normalize, truncate, text).

`windve:emb:v2:{model}:{revision}:n{0|1}:t{0|1}:{sha256(text) hex}`. The text is hashed so a key
has a fixed size whatever the text; model and revision stay readable so an operator can find
or delete one model's entries (`SCAN MATCH windve:emb:v2:{model}:*`). `v2` names the value
format (base.py: a token count, then the float32 vector) so a format never reads another's
value: v1's values, the vector alone, are left to their TTL. The service's
"revision" is everything besides the text that made the vector: the weights' hash, the
configuration's (pooling, tokenizer), the engine and dtype settings and an input cap
(windve/frontend/pipeline.py), so services that differ in any share no entry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from urllib.parse import quote

KEY_NAMESPACE = "windve:emb:v2"


def key_prefix(model: str, revision: str, normalize: bool, truncate: bool) -> bytes:
    # ':' is quoted inside the parts so that no two (model, revision) pairs share a prefix.
    parts = (quote(model, safe="/@._-+"), quote(revision, safe="._-+"))
    return f"{KEY_NAMESPACE}:{parts[0]}:{parts[1]}:n{int(normalize)}:t{int(truncate)}:".encode()


def text_digest(text: str | list[int]) -> bytes:
    """A text's digest; token ids (TEI's /embed takes them) are digested as their decimal list,
    behind a mark no text's digest has, so no text and no list of ids share a key."""
    if isinstance(text, str):
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest().encode()
    return b"ids-" + hashlib.sha256(",".join(map(str, text)).encode()).hexdigest().encode()


def cache_key(model: str, revision: str, normalize: bool, truncate: bool, text: str) -> bytes:
    return key_prefix(model, revision, normalize, truncate) + text_digest(text)


def cache_keys(
    model: str, revision: str, normalize: bool, truncate: bool, texts: Iterable[str | list[int]]
) -> list[bytes]:
    """Keys of a whole request: the prefix is built once."""
    prefix = key_prefix(model, revision, normalize, truncate)
    return [prefix + text_digest(text) for text in texts]
