"""Read a request body with a byte limit, and decode it as JSON."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from windve.frontend.errors import TOO_LARGE, VALIDATION, ApiError


async def read_json(request: Request, limit: int) -> Any:
    """The decoded JSON body; 413 past `limit` bytes (checked before reading when declared)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes", TOO_LARGE)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes", TOO_LARGE)
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body:
        raise ApiError(422, "request body is empty; send a JSON object", VALIDATION)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(422, f"request body is not valid JSON: {exc}", VALIDATION) from None
