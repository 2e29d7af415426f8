"""Cross-origin calls from browsers (CORS), for the origins of setting `cors_allow_origins`.

TEI, vLLM and Infinity let any origin call them by default; so does WindVE ("*"), and a list
names the only origins allowed ([] sends no CORS headers, so browsers refuse cross-origin reads).
No credentials (cookies) are involved: an API key travels in the Authorization header, which a
preflight is told it may send.

The headers of an answer are added by the HTTP protocol (http_protocol.py), to every answer
whether the app, the overload gate or the protocol itself made it: a browser that cannot read a
429 or a 401 sees only a network error. A preflight (OPTIONS with Access-Control-Request-Method)
is answered by the app's OPTIONS answer (fallbacks.py), without the API key, which browsers never
send on one, and without touching an engine.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

ANY = "*"
# What a page's script may read of an answer beyond the safelisted headers: when to come back after a 429.
EXPOSED = (b"access-control-expose-headers", b"retry-after")
ALLOW_ANY = (b"access-control-allow-origin", b"*")
PREFLIGHT_MAX_AGE = b"3600"  # seconds a browser may reuse a preflight's answer
Headers = list[tuple[bytes, bytes]]


class CorsPolicy:
    """Which origins may read the answers, and the headers that tell a browser so."""

    def __init__(self, origins: Sequence[str]) -> None:
        self.any = ANY in origins
        self.origins = frozenset(origin.encode("latin-1") for origin in origins if origin != ANY)
        self._any_headers: Headers = [ALLOW_ANY, EXPOSED]

    def answer_headers(self, request_headers: Iterable[tuple[bytes, bytes]]) -> Headers:
        """The CORS headers of the answer to a request with (lowercased) `request_headers`; none
        for a request without an Origin (not a browser's cross-origin call) or from an origin
        not allowed."""
        origin = _header(request_headers, b"origin")
        if origin is None:
            return []
        if self.any:
            return self._any_headers
        if origin in self.origins:
            return [(b"access-control-allow-origin", origin), (b"vary", b"origin"), EXPOSED]
        return []

    def preflight_headers(self, request_headers: Iterable[tuple[bytes, bytes]], allowed: Iterable[str]) -> Headers:
        """The headers that answer a preflight for a path that serves the methods `allowed`, besides
        the answer's own (answer_headers); none for a request that is not one from an allowed origin."""
        request_headers = list(request_headers)
        asks = _header(request_headers, b"access-control-request-method") is not None
        if not asks or not self.answer_headers(request_headers):
            return []
        methods = ", ".join(sorted(set(allowed) - {"OPTIONS"})).encode("latin-1")
        headers = [(b"access-control-allow-methods", methods), (b"access-control-max-age", PREFLIGHT_MAX_AGE)]
        # Whatever the page asks to send: Content-Type (JSON is not a "simple" type), Authorization
        # (the API key; "*" would not cover it), Content-Encoding, Cache-Control.
        if (asked := _header(request_headers, b"access-control-request-headers")) is not None:
            headers.append((b"access-control-allow-headers", asked))
        return headers


@functools.lru_cache(maxsize=8)
def cors_policy(origins: tuple[str, ...]) -> CorsPolicy | None:
    """The policy of setting `cors_allow_origins` (as a tuple); None when it allows no origin."""
    return CorsPolicy(origins) if origins else None


def policy_of(settings: object) -> CorsPolicy | None:
    """The policy of `settings` (None for settings without one, as a test's stand-in app has)."""
    return cors_policy(tuple(getattr(settings, "cors_allow_origins", None) or ()))


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((value for key, value in headers if key == name), None)
