"""A minimal HTTP/1.1 client for timing a server: raw asyncio streams, one kept-alive connection per
request in flight.

The warm-up probe (windve.probe) and `windve calibrate` over HTTP (estimator.http_pool) time the
server with it, so the client must cost little beside what it times. Against a trivial server on a
shared 2-core machine this client spent 60 us of CPU per request one at a time and 13 us at 64 at
once; one httpx.AsyncClient spent 590 us and 5 ms. On a GPU host that serves ~7,000 requests/s, a
calibration client of one httpx client per connection was the bottleneck: it fitted 1.17 ms per
query in flight where wrk saw ~0.14 ms, and put the depth 7x too shallow (bench/ESTIMATOR.md).

It speaks only what those two need: a request encoded once (before the clock starts), an answer
with Content-Length (what WindVE's routes send), http and https. A connection whose exchange failed
or was cancelled is closed, never lent again: its stream may hold half an answer.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

# uvicorn closes a keep-alive connection idle for 5 s: one idle for this long is opened again
# rather than risk being closed while a request is on it.
IDLE_LIMIT = 2.0
OPEN_AT_ONCE = 64  # connections opened together: inside asyncio's default listen queue of 100


class NoAnswer(ConnectionError):
    """The connection failed before a whole answer came back."""


@dataclass(frozen=True)
class Target:
    """Where requests go: host, port, the URL's path prefix, and whether TLS wraps the stream."""

    host: str
    port: int
    prefix: str = ""
    tls: bool = False

    @classmethod
    def from_url(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        return cls(parts.hostname, parts.port or (443 if tls else 80), parts.path.rstrip("/"), tls)

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
        """One encoded request for `path` (after the prefix)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {host}:{self.port}"]
        if body:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.used = time.monotonic()

    def fresh(self, now: float) -> bool:
        return now - self.used < IDLE_LIMIT and not self.reader.at_eof() and not self.writer.is_closing()

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        """Send one encoded request and read its whole answer: (status, body). Raises NoAnswer."""
        try:
            self.writer.write(request)
            head = await self.reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            body = await self.reader.readexactly(_content_length(head))
            if b"\r\nconnection: close" in head.lower():  # the server will not read another request here
                self.writer.close()
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
            raise NoAnswer(f"no whole answer: {error!r}") from None
        self.used = time.monotonic()
        return status, body

    def close(self) -> None:
        self.writer.close()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise ValueError(f"an answer without Content-Length: {head[:200]!r}")


class ConnectionPool:
    """Kept-alive connections to one target: each request in flight holds one of its own.

    One connection per request in flight, because queuing in the client would be timed as server
    latency; connections are kept for the next round, so a round at a level already reached opens
    none."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._idle: list[Connection] = []
        self.opened = 0
        self._random = random.Random()
        self._tls = ssl.create_default_context() if target.tls else None

    async def _open(self) -> Connection:
        try:
            reader, writer = await asyncio.open_connection(self.target.host, self.target.port, ssl=self._tls)
        except OSError as error:
            raise NoAnswer(f"cannot connect to {self.target.host}:{self.target.port}: {error}") from None
        self.opened += 1
        return Connection(reader, writer)

    def _take_fresh(self) -> Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.fresh(now):
                return connection
            connection.close()
        return None

    async def _open_greeted(self, greeting: bytes | None) -> Connection:
        connection = await self._open()
        if greeting is not None:
            try:
                await connection.exchange(greeting)  # any answer will do: the server has taken the connection
            except BaseException:
                connection.close()
                raise
            if not connection.fresh(time.monotonic()):  # answered with Connection: close
                return await self._open()
        return connection

    async def connections(self, count: int, greeting: bytes | None = None) -> list[Connection]:
        """`count` connections, ready before the clock starts; give them back with `keep`.

        A connect returns once the kernel's handshake is done, before the server's loop has accepted
        the connection: the first request on it would wait for that accept, and a round that opens
        hundreds at once would time hundreds of accepts. With a `greeting` (a cheap request such as
        GET /health) each new connection is opened and answered once first, OPEN_AT_ONCE at a time.

        Fewer than the pool holds are a random choice of them. The idle list is in the order the last
        round's answers came, and the last answered sit on the front ends that were slowest: taking
        those round after round put every request of a level after a deeper one on two of four front
        ends (bench/ESTIMATOR.md, 2026-11-27, a fourth session).
        """
        fresh: list[Connection] = []
        while (connection := self._take_fresh()) is not None:  # every idle one: the stale closed
            fresh.append(connection)
        self._random.shuffle(fresh)
        taken, self._idle = fresh[:count], fresh[count:]
        try:
            while len(taken) < count:
                wave = min(OPEN_AT_ONCE, count - len(taken))
                opening = (self._open_greeted(greeting) for _ in range(wave))
                opened = await asyncio.gather(*opening, return_exceptions=True)
                taken += [c for c in opened if isinstance(c, Connection)]
                for outcome in opened:
                    if isinstance(outcome, BaseException):
                        raise outcome
        except BaseException:
            self.keep(taken)
            raise
        return taken

    def keep(self, connections: list[Connection]) -> None:
        self._idle.extend(connections)

    @asynccontextmanager
    async def lend(self) -> AsyncIterator[Connection]:
        connection = self._take_fresh() or await self._open()
        try:
            yield connection
        except BaseException:
            connection.close()
            raise
        self._idle.append(connection)

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        """One request on a lent connection: (status, body). Raises NoAnswer."""
        async with self.lend() as connection:
            return await connection.exchange(request)

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle = []
