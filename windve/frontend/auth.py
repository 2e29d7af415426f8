"""The optional bearer API key (setting `api_key`)."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.requests import Request

from windve.frontend.errors import UNAUTHORIZED, ApiError

_SCHEME = b"bearer"


def authorized(headers: Iterable[tuple[bytes, bytes]], expected: str | None) -> bool:
    """Whether raw request `headers` carry `Authorization: Bearer <expected>` (any, when no key is set).

    The key is compared on the bytes the client sent against the key encoded as UTF-8: header values
    are bytes on the wire, and decoding them (Starlette decodes as latin-1) would never match a
    non-ASCII key.
    """
    if not expected:
        return True
    sent = next((value for name, value in headers if name.lower() == b"authorization"), b"")
    scheme, _, token = sent.strip().partition(b" ")
    return scheme.lower() == _SCHEME and hmac.compare_digest(token.strip(), expected.encode("utf-8"))


def check_api_key(request: Request) -> None:
    """Raise a 401 ApiError unless the request carries `Authorization: Bearer <api_key>`."""
    if not authorized(request.scope["headers"], request.app.state.settings.api_key):
        raise ApiError(401, "missing or wrong API key: send `Authorization: Bearer <key>`", UNAUTHORIZED)
