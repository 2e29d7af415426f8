"""Read a request body with a byte limit, decode its transfer and content codings, and parse it as JSON."""

from __future__ import annotations

import zlib
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request

from windve.frontend.errors import NOT_IMPLEMENTED, TOO_LARGE, UNSUPPORTED_ENCODING, VALIDATION, ApiError
from windve.frontend.pipeline import release_pass

# Content codings a body may come in (RFC 9110 8.4.1), as zlib's window bits: gzip's header, or
# deflate's, which HTTP defines as the zlib format.
_CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


async def read_json(request: Request, limit: int) -> Any:
    """The decoded JSON body; 413 past `limit` bytes, as sent (checked before reading when declared)
    or decoded; 415 for a content coding other than gzip or deflate, 501 for such a transfer coding."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes", TOO_LARGE)
    # A header sent on several lines is one list (RFC 9110 5.3): each line's codings count.
    codings = _codings(", ".join(request.headers.getlist("content-encoding")))
    # Transfer codings go on after the content codings, so they come off first; the parser has
    # taken off `chunked`, the last. A body sent `gzip, chunked` had been read as JSON still gzipped.
    codings += _transfer_codings(", ".join(request.headers.getlist("transfer-encoding")))
    chunks = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes", TOO_LARGE)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
        # The rest of the body is the client's to send: until it has, the request holds no room at
        # the gate. Four clients that sent a head and part of a body had made a service of depth 4,
        # its pool idle, answer 429 to every other request for as long as they kept the connection.
        release_pass(request.scope)
    body = b"".join(chunks)
    for coding in reversed(codings):  # the last coding applied comes off first
        body = _decoded(body, coding, limit)
    if not body:
        raise ApiError(422, "request body is empty; send a JSON object", VALIDATION)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(422, f"request body is not valid JSON: {exc}", VALIDATION) from None


def _codings(header: str) -> list[str]:
    codings, unsupported = _listed(header, ("identity",))
    if unsupported is not None:
        raise ApiError(
            415, f"Content-Encoding {unsupported!r} is not supported: send the body as is, gzip or deflate",
            UNSUPPORTED_ENCODING, headers={"Accept-Encoding": "gzip, deflate"},
        )  # fmt: skip
    return codings


def _transfer_codings(header: str) -> list[str]:
    codings, unsupported = _listed(header, ("chunked", "identity"))
    if unsupported is not None:
        raise ApiError(
            501, f"Transfer-Encoding {unsupported!r} is not supported: send the body chunked, gzip or deflate",
            NOT_IMPLEMENTED,
        )  # fmt: skip
    return codings


def _listed(header: str, ignored: tuple[str, ...]) -> tuple[list[str], str | None]:
    """The codings a header lists, lowercased, `ignored` left out; and the first of them this
    server cannot decode (None: it decodes them all)."""
    codings = [coding for coding in (part.strip().lower() for part in header.split(",")) if coding]
    codings = [coding for coding in codings if coding not in ignored]
    return codings, next((coding for coding in codings if coding not in _CODINGS), None)


def _decoded(body: bytes, coding: str, limit: int) -> bytes:
    """`body` with `coding` taken off, never more than `limit` bytes of it (a small body may inflate
    a thousandfold). A gzip body may hold several members, one after the other (RFC 1952 2.2), as
    `gzip.decompress` reads them; anything else after the stream is an error, not ignored."""
    decoded = b""
    rest = body
    while True:
        decoder = zlib.decompressobj(_CODINGS[coding])
        try:
            decoded += decoder.decompress(rest, limit + 1 - len(decoded))  # never 0, zlib's "no limit"
        except zlib.error as exc:
            raise ApiError(422, f"request body is not valid {coding} data: {exc}", VALIDATION) from None
        if len(decoded) > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes once decoded ({coding})", TOO_LARGE)
        if not decoder.eof:
            raise ApiError(422, f"request body is not valid {coding} data: it ends before its stream does", VALIDATION)
        rest = decoder.unused_data
        if not rest:
            return decoded
        if coding == "deflate":
            raise ApiError(422, f"request body is not valid {coding} data: bytes follow its stream", VALIDATION)
