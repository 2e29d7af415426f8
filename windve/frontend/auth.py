"""The optional bearer API key (setting `api_key`)."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from windve.frontend.errors import UNAUTHORIZED, ApiError

_SCHEME = b"bearer"


def check_api_key(request: Request) -> None:
    """Raise a 401 ApiError unless the request carries `Authorization: Bearer <api_key>`.

    The key is compared on the bytes the client sent against the key encoded as UTF-8: header values
    are bytes on the wire, and decoding them (Starlette decodes as latin-1) would never match a
    non-ASCII key.
    """
    expected = request.app.state.settings.api_key
    if not expected:
        return
    sent = _authorization(request)
    scheme, _, token = sent.strip().partition(b" ")
    if scheme.lower() != _SCHEME or not hmac.compare_digest(token.strip(), expected.encode("utf-8")):
        raise ApiError(401, "missing or wrong API key: send `Authorization: Bearer <key>`", UNAUTHORIZED)


def _authorization(request: Request) -> bytes:
    for name, value in request.scope["headers"]:
        if name.lower() == b"authorization":
            return value
    return b""
