"""API errors, and their two wire shapes: TEI's and OpenAI's.

Errors are raised with TEI's status codes (422 for a bad field, 413 for too much); the OpenAI shape
maps them to the 400 OpenAI answers for every invalid request, which its SDK raises as BadRequestError.
"""

from __future__ import annotations

import math

import orjson
from starlette.responses import Response

# TEI's error types (router/src/http/types.rs ErrorType, snake_case on the wire), and this
# service's own for what TEI has no word for.
VALIDATION = "validation"
OVERLOADED = "overloaded"
BACKEND = "backend"
UNHEALTHY = "unhealthy"
TOO_LARGE = "payload_too_large"
UNAUTHORIZED = "unauthorized"
MODEL_NOT_FOUND = "model_not_found"
NOT_FOUND = "not_found"  # no route at this path
METHOD_NOT_ALLOWED = "method_not_allowed"
MALFORMED = "malformed_request"  # HTTP the parser could not read
UNSUPPORTED_ENCODING = "unsupported_media_type"  # a Content-Encoding the server cannot decode
NOT_IMPLEMENTED = "not_implemented"  # a Transfer-Encoding the server cannot decode (RFC 9112 6.1: 501)
INTERNAL = "internal"

_OPENAI_TYPES = {
    VALIDATION: ("invalid_request_error", None),
    TOO_LARGE: ("invalid_request_error", "payload_too_large"),
    UNAUTHORIZED: ("invalid_request_error", "invalid_api_key"),
    MODEL_NOT_FOUND: ("invalid_request_error", "model_not_found"),
    NOT_FOUND: ("invalid_request_error", None),
    METHOD_NOT_ALLOWED: ("invalid_request_error", None),
    MALFORMED: ("invalid_request_error", None),
    UNSUPPORTED_ENCODING: ("invalid_request_error", "unsupported_content_encoding"),
    NOT_IMPLEMENTED: ("invalid_request_error", "unsupported_transfer_encoding"),
    OVERLOADED: ("server_busy", "busy"),
    BACKEND: ("server_error", "backend_error"),
    UNHEALTHY: ("server_error", "unavailable"),
    INTERNAL: ("server_error", None),
}

# Where OpenAI clients call: the /v1 API, and Infinity's unprefixed twins of it.
_OPENAI_PREFIXES = ("/v1/", "/embeddings/", "/models/")
_OPENAI_PATHS = ("/v1", "/embeddings", "/models")


def is_openai_path(path: str) -> bool:
    """Whether a path belongs to the OpenAI-shaped API (its errors then answer in OpenAI's shape)."""
    return path in _OPENAI_PATHS or path.startswith(_OPENAI_PREFIXES)


class ApiError(Exception):
    """An error answered to the client: status, a message that says what was wrong, a type."""

    def __init__(
        self,
        status: int,
        message: str,
        error_type: str,
        *,
        param: str | None = None,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param
        self.retry_after = retry_after
        self.extra_headers = headers or {}

    def headers(self) -> dict[str, str]:
        headers = dict(self.extra_headers)
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return headers

    def tei_response(self) -> Response:
        body = {"error": self.message, "error_type": self.error_type}
        return json_response(body, self.status, self.headers())

    def openai_status(self) -> int:
        # OpenAI answers 400 to every invalid request, too many inputs included; only a body over the
        # byte limit (an error that names no field) keeps 413, as the proxies in front of OpenAI answer.
        if self.status == 422 or (self.status == 413 and self.param is not None):
            return 400
        return self.status

    def openai_response(self) -> Response:
        kind, code = _OPENAI_TYPES.get(self.error_type, ("invalid_request_error", None))
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": code}}
        return json_response(body, self.openai_status(), self.headers())

    def response_for(self, path: str) -> Response:
        """This error in the shape of the API `path` belongs to."""
        return self.openai_response() if is_openai_path(path) else self.tei_response()


def json_response(body: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )
