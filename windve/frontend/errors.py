"""API errors, and their two wire shapes: TEI's and OpenAI's."""

from __future__ import annotations

import math

import orjson
from starlette.responses import Response

# TEI's error types (router/src/http/types.rs ErrorType, snake_case on the wire).
VALIDATION = "validation"
OVERLOADED = "overloaded"
BACKEND = "backend"
UNHEALTHY = "unhealthy"
TOO_LARGE = "payload_too_large"
UNAUTHORIZED = "unauthorized"
NOT_FOUND = "not_found"

_OPENAI_TYPES = {
    VALIDATION: ("invalid_request_error", None),
    TOO_LARGE: ("invalid_request_error", "payload_too_large"),
    UNAUTHORIZED: ("invalid_request_error", "invalid_api_key"),
    NOT_FOUND: ("invalid_request_error", "model_not_found"),
    OVERLOADED: ("server_busy", "busy"),
    BACKEND: ("server_error", "backend_error"),
    UNHEALTHY: ("server_error", "unavailable"),
}


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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return headers

    def tei_response(self) -> Response:
        body = {"error": self.message, "error_type": self.error_type}
        return json_response(body, self.status, self.headers())

    def openai_response(self) -> Response:
        kind, code = _OPENAI_TYPES.get(self.error_type, ("invalid_request_error", None))
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": code}}
        return json_response(body, self.status, self.headers())


def json_response(body: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )
