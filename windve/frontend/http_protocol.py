"""uvicorn's httptools protocol, answering the requests its parser refuses in JSON.

A request the HTTP parser cannot read never reaches the app: uvicorn answers it with a plain-text
400 "Invalid HTTP request received.". A `Content-Length` past 2^64 (llhttp: "Content-Length
overflow") is one: it is answered here as the 413 the app gives any body over its limit, and the
others as a 400, both in the shape of the API the request's path belongs to.

It also answers /health itself, from the dispatcher's state and without a request task, so that a
probe waits for no more than the event loop's current turn.

And it answers BUSY itself. Under a storm of clients that re-ask at once, most requests are
refusals, and each one that goes through a request task, the ASGI stack and a fresh Response
costs the event loop about twice what the refusal needs; the loop that also delivers the
admitted requests' answers then falls behind by a whole turn of refusals. When the overload
gate (gate.py) says there is no room, the request is answered here, from a cache of rendered
refusals, as soon as its body has been read, without a task.

Serve with `uvicorn.Config(app, http=JsonErrorHttpToolsProtocol)` (or the import string
"windve.frontend.http_protocol:JsonErrorHttpToolsProtocol" where uvicorn starts workers itself).
"""

from __future__ import annotations

import functools
import math
import sys
import time
from http import HTTPStatus

import httptools
from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from windve.frontend.errors import MALFORMED, TOO_LARGE, ApiError, json_response
from windve.frontend.gate import OverloadGate
from windve.frontend.pipeline import ARRIVED
from windve.frontend.routes import health_answer

HEALTH_PATHS = ("/health", "/")  # GET / is /health too, as TEI answers it
SHUTDOWN_GRACE = 1.0  # seconds an idle connection stays open once shutdown begins


class JsonErrorHttpToolsProtocol(HttpToolsProtocol):
    # (head, body, keep-alive) of an answer to send once the request is read: a refusal, or /health's.
    _refused: tuple[bytes, bytes, bool] | None = None
    _shutting_down = False

    def shutdown(self) -> None:
        """The server's graceful shutdown: uvicorn closes an idle keep-alive connection at once, and a
        request already in its socket, not yet read, is then reset (a client saw "Connection reset by
        peer" during a SIGTERM drain). An idle connection stays open for SHUTDOWN_GRACE instead; what
        arrives meanwhile is answered, by a draining service, with `connection: close`."""
        if self.cycle is None or self.cycle.response_complete:
            self._shutting_down = True
            # Then uvicorn's own: close if still idle, else let the answer in progress close it.
            self.loop.call_later(SHUTDOWN_GRACE, super().shutdown)
        else:
            super().shutdown()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # The step's ready time where the loop is the front end's (event_loop.py): this request may
        # have waited behind the step's other sockets, which the parse time would leave out.
        ready_at = getattr(self.loop, "ready_at", None)
        self.scope[ARRIVED] = time.perf_counter() if ready_at is None else ready_at  # type: ignore[literal-required]

    def on_headers_complete(self) -> None:
        if not (self._health_early() or self._refuse_early()):
            super().on_headers_complete()
            if self._shutting_down and self.cycle is not None:
                self.cycle.keep_alive = False

    def _health_early(self) -> bool:
        method = self.parser.get_method()
        if method not in (b"GET", b"HEAD") or _path(self.url) not in HEALTH_PATHS or not self._may_answer_early():
            return False
        gate = _gate_of(self.app)
        if gate is None:
            return False
        response = json_response(*health_answer(gate.state))
        body = b"" if method == b"HEAD" else response.body
        self._refused = (_status_and_headers(response), body, self._keep_alive())
        return True

    def _keep_alive(self) -> bool:
        return not self._shutting_down and self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()

    def _may_answer_early(self) -> bool:
        # A pipelined request behind one still running: the normal queue keeps the order.
        running = self.cycle is not None and not self.cycle.response_complete
        return not (running or self.expect_100_continue or self.parser.should_upgrade())

    def _refuse_early(self) -> bool:
        if self.parser.get_method() != b"POST" or not self._may_answer_early():
            return False
        gate = _gate_of(self.app)
        if gate is None:
            return False
        path = _path(self.url)
        error = gate.refusal(path, self.headers)
        if error is None:
            return False
        # Retry-After is whole seconds on the wire: key the cache by what is sent.
        retry = None if error.retry_after is None else max(1, math.ceil(error.retry_after))
        self._refused = (*_rendered(error.status, error.message, error.error_type, retry, path), self._keep_alive())
        return True

    def on_body(self, body: bytes) -> None:
        if self._refused is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused is None:
            super().on_message_complete()
            return
        head, body, keep_alive = self._refused
        self._refused = None
        if self.transport.is_closing():
            return
        self._write(head, body, keep_alive)
        self.on_response_complete()  # uvicorn's own bookkeeping: pipelined requests, keep-alive timer

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this while handling the parser's exception, which says what was wrong.
        response = parse_error(sys.exception(), msg).response_for(_path(self.url))
        self._write(_status_and_headers(response), response.body, keep_alive=False)

    def _write(self, head: bytes, body: bytes, keep_alive: bool) -> None:
        """An answer built here: its status line and own headers, the server's, then the body."""
        defaults = b"".join(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers)
        closing = b"" if keep_alive else b"connection: close\r\n"
        self.transport.write(head + defaults + closing + b"\r\n" + body)
        if not keep_alive:
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


@functools.lru_cache(maxsize=64)
def _rendered(status: int, message: str, error_type: str, retry_after: int | None, path: str) -> tuple[bytes, bytes]:
    """The status line and own headers, and the body, of a refusal: the same bytes the ASGI gate
    sends (rendered by it once per distinct answer)."""
    response = ApiError(status, message, error_type, retry_after=retry_after).response_for(path)
    return _status_and_headers(response), response.body


def _status_and_headers(response: Response) -> bytes:
    head = [f"HTTP/1.1 {response.status_code} {HTTPStatus(response.status_code).phrase}\r\n".encode()]
    head += [name + b": " + value + b"\r\n" for name, value in response.raw_headers]
    return b"".join(head)


@functools.lru_cache(maxsize=8)
def _gate_of(app) -> OverloadGate | None:
    """The overload gate under uvicorn's middlewares, if the app is served through one."""
    for _ in range(8):
        if isinstance(app, OverloadGate):
            return app
        app = getattr(app, "app", None)
    return None


def _path(url: bytes) -> str:
    """The path of the request line's target, as far as the parser read it."""
    return url.split(b"?", 1)[0].decode("latin-1")
