"""JSON answers, in the shape of the API a path belongs to, for what the routes never see: unknown
paths and methods, the framework's validation, unexpected exceptions."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match

from windve.frontend.cors import policy_of
from windve.frontend.errors import INTERNAL, MALFORMED, METHOD_NOT_ALLOWED, NOT_FOUND, VALIDATION, ApiError
from windve.frontend.routes import MODEL_PATHS, model_by_id

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def install_fallbacks(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(Exception, _unexpected)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    path, method = _path(request), request.method
    if exc.status_code == 404:
        model_id = _model_id(path)
        if model_id is None:
            message = f"Invalid URL ({method} {path}): no such route; see /docs"
            return ApiError(404, message, NOT_FOUND).response_for(path)
        if method == "GET":
            # An id no route pattern matches (one with a newline, say) is still an unknown model.
            return await model_by_id(request, model_id)
        return _not_allowed(method, path, {"GET"}, request)
    if exc.status_code == 405:
        return _not_allowed(method, path, _allowed_methods(request), request)
    return ApiError(exc.status_code, str(exc.detail), MALFORMED, headers=exc.headers).response_for(path)


def _path(request: Request) -> str:
    # The decoded path as routed: _path(request) would drop a decoded newline (urllib strips them).
    return request.scope["path"]


def _not_allowed(method: str, path: str, allowed: set[str], request: Request) -> Response:
    allow = ", ".join(sorted(allowed | {"OPTIONS"}))
    if method == "OPTIONS":
        response = Response(status_code=204, headers={"Allow": allow})
        # A browser's preflight; the answer's Access-Control-Allow-Origin is added with every answer's.
        policy = policy_of(request.app.state.settings)
        if policy is not None:
            response.raw_headers.extend(policy.preflight_headers(request.scope["headers"], allowed))
        return response
    message = f"{method} is not allowed on {path}; allowed: {allow}"
    return ApiError(405, message, METHOD_NOT_ALLOWED, headers={"Allow": allow}).response_for(path)


def _model_id(path: str) -> str | None:
    for prefix in MODEL_PATHS:
        if path.startswith(prefix):
            return path[len(prefix):]
    return None


def _allowed_methods(request: Request) -> set[str]:
    """Every method some route serves at this path (Starlette's 405 names only the first route's).

    Asked of the routes themselves, which covers included routers and FastAPI's own pages alike.
    """
    allowed = set()
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.add(method)
    return allowed


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    errors = exc.errors()
    message = str(errors[0].get("msg", exc)) if errors else str(exc)
    return ApiError(422, message, VALIDATION).response_for(_path(request))


async def _api_error(request: Request, exc: ApiError) -> Response:
    return exc.response_for(_path(request))


async def _unexpected(request: Request, exc: Exception) -> Response:
    # The server error middleware logs the exception after this answer is sent.
    return internal_error(request, exc)


def internal_error(request: Request, exc: Exception) -> Response:
    """The 500 for an exception no handler expected, in the route's error shape."""
    return ApiError(500, f"internal error ({type(exc).__name__}); see the server log", INTERNAL).response_for(
        _path(request)
    )
