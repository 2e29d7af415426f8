"""uvicorn's httptools protocol, answering the requests its parser refuses in JSON.

A request the HTTP parser cannot read never reaches the app: uvicorn answers it with a plain-text
400 "Invalid HTTP request received.". A `Content-Length` past 2^64 (llhttp: "Content-Length
overflow") is one: it is answered here as the 413 the app gives any body over its limit, and the
others as a 400, both in the shape of the API the request's path belongs to.

Serve with `uvicorn.Config(app, http=JsonErrorHttpToolsProtocol)` (or the import string
"windve.frontend.http_protocol:JsonErrorHttpToolsProtocol" where uvicorn starts workers itself).
"""

from __future__ import annotations

import sys
from http import HTTPStatus

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from windve.frontend.errors import MALFORMED, TOO_LARGE, ApiError


class JsonErrorHttpToolsProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this while handling the parser's exception, which says what was wrong.
        response = parse_error(sys.exception(), msg).response_for(_path(self.url))
        head = [f"HTTP/1.1 {response.status_code} {HTTPStatus(response.status_code).phrase}\r\n".encode()]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        head += [name + b": " + value + b"\r\n" for name, value in response.raw_headers]
        head.append(b"connection: close\r\n\r\n")
        self.transport.write(b"".join(head) + response.body)
        self.transport.close()


def parse_error(exc: BaseException | None, fallback: str) -> ApiError:
    """The ApiError for a request the HTTP parser refused with `exc`."""
    if not isinstance(exc, httptools.HttpParserError):
        return ApiError(400, f"malformed HTTP request: {fallback}", MALFORMED)
    reason = str(exc) or fallback
    if "Content-Length overflow" in reason:
        return ApiError(
            413, "the declared Content-Length exceeds the request body limit (setting max_request_bytes)", TOO_LARGE
        )
    return ApiError(400, f"malformed HTTP request: {reason}", MALFORMED)


def _path(url: bytes) -> str:
    """The path of the request line's target, as far as the parser read it."""
    return url.split(b"?", 1)[0].decode("latin-1")
