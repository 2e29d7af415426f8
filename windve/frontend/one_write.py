"""An answer's head and the first part of its body in one write to the socket.

uvicorn writes an answer as two writes: the status line and headers when the app sends
`http.response.start`, then the body. On a connection with TCP_NODELAY (http_protocol.py) each
write is a send() of its own, and the head (~300 bytes) a segment of its own: two system calls in
the front end and, on loopback (a sidecar, a load generator), two wake-ups of the client, whose
delivery the kernel runs in the front end's time (bench/SERVED.md, 2026-12-07, seventh session).
`OneWriteTransport` stands between a request's cycle and its connection's transport and holds the
head until the body's first write, which carries both.

What would leave a held head unsent is covered: a HEAD request's answer has no body write, so its
head is not held; a cycle that closes the connection (an error after the head, `connection:
close`) sends what it holds first; every other body message, an empty one too, is a write.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class _Cycle(Protocol):
    response_started: bool
    scope: dict


class OneWriteTransport:
    """The transport a request's cycle writes its answer to: `transport`, with the answer's head
    held until the write after it."""

    __slots__ = ("_cycle", "_head_to_come", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: _Cycle) -> None:
        self._transport = transport
        self._cycle = cycle
        self._held: bytes | None = None
        self._head_to_come = True

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif self._head_to_come and self._cycle.response_started:
            # The head: the first write once the cycle marks its answer started (a `100 Continue`
            # is written before that, and goes at once: the client waits for it to send the body).
            self._head_to_come = False
            if self._cycle.scope.get("method") == "HEAD":
                self._transport.write(data)
            else:
                self._held = data
        else:
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def flush(self) -> None:
        """Write a held head now."""
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
