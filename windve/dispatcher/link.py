"""Messages between a front end and the dispatcher over a Unix stream socket, read and written by
the event loop without a future per message (both ends of the hop).

Why a plain socket and not ZMQ, which carried this hop before (bench/transport.py, the same
messages between two asyncio processes, in one run): per request, ZMQ's DEALER/ROUTER cost each
side 44-47 us of CPU (its I/O thread hands every message between threads and wakes them), a Unix
socket 8.5-15 us, and a shared-memory ring with an eventfd wake-up 6.5-11 us (bench/SERVED.md).
The dispatcher is one process that every request crosses; on an H100 it used about a core at
16,494 requests/s with ZMQ. The ring saves little more than the socket and needs memory fences
that Python does not have (a lost wake-up, or on ARM hosts reordered stores), so the socket it is.

A message is a list of frames. On the wire: its body's length (u32), the frame count (u32), then
each frame's length (u32) and bytes. Sends are queued and written at the end of the loop's turn,
one send() for everything the turn queued. Reads take what the socket holds and hand over whole
messages for at most `turn_seconds` of one turn (at least one), so that an engine's answer, and
the batch it frees the engine for, wait behind a millisecond of reading, not behind a burst of
hundreds of messages (bench/handoff.py). Nothing bounds what waits to be written: the queue
manager's depths bound what is in flight already.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import Callable, Sequence

READ_TURN_SECONDS = 0.001
READ_BYTES = 1 << 18
_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<II")  # body length, frame count

log = logging.getLogger(__name__)


def encode(frames: Sequence[bytes | memoryview]) -> bytes:
    """One message on the wire."""
    sizes = [memoryview(frame).nbytes for frame in frames]
    parts = [_HEAD.pack(4 + 4 * len(frames) + sum(sizes), len(frames))]
    for frame, size in zip(frames, sizes, strict=True):
        parts += (_U32.pack(size), frame)
    return b"".join(parts)


def decode(body: memoryview) -> list[bytes]:
    """The frames of one message's body (after its length)."""
    count = _U32.unpack_from(body, 0)[0]
    frames, at = [], 4
    for _ in range(count):
        size = _U32.unpack_from(body, at)[0]
        frames.append(bytes(body[at + 4 : at + 4 + size]))
        at += 4 + size
    if at != len(body):
        raise ValueError("malformed message: its frames do not fill its length")
    return frames


class FrameLink:
    """One connected stream socket, watched by the running loop once `start` is called."""

    def __init__(
        self,
        sock: socket.socket,
        on_message: Callable[[list[bytes]], None],
        on_close: Callable[[], None] | None = None,
        turn_seconds: float = READ_TURN_SECONDS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._on_message = on_message
        self._on_close = on_close
        self._turn_seconds = turn_seconds
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in = bytearray()
        self._out = bytearray()
        self._flush_queued = self._parse_queued = self._writer = False
        self.closed = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.sock.fileno(), self._readable)

    def send(self, frames: Sequence[bytes | memoryview]) -> None:
        """Queue a message; it is written at the end of this turn. Dropped once the link is closed:
        the peer has gone, and nobody would read it."""
        if self.closed:
            return
        self._out += encode(frames)
        if not self._flush_queued and not self._writer:
            self._flush_queued = True
            self._loop.call_soon(self._flush)

    def close(self) -> None:
        """Write what is queued if the socket takes it now, then close (no on_close: we chose to)."""
        if self.closed:
            return
        with contextlib.suppress(OSError):
            self.sock.send(self._out)
        self._shut()

    def _shut(self) -> None:
        self.closed = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.sock.fileno())
            if self._writer:
                self._loop.remove_writer(self.sock.fileno())
        self.sock.close()

    def _lost(self) -> None:
        if not self.closed:
            self._shut()
            if self._on_close is not None:
                self._on_close()

    def _flush(self) -> None:
        self._flush_queued = False
        if self.closed or not self._out:
            return
        try:
            sent = self.sock.send(self._out)
        except BlockingIOError:
            sent = 0
        except OSError:  # reset or broken pipe: the peer has gone
            self._lost()
            return
        del self._out[:sent]
        if self._out and not self._writer:  # the socket's buffer is full: write when it drains
            self._writer = True
            self._loop.add_writer(self.sock.fileno(), self._writable)

    def _writable(self) -> None:
        self._writer = False
        self._loop.remove_writer(self.sock.fileno())
        self._flush()

    def _readable(self) -> None:
        try:
            data = self.sock.recv(READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._lost()
            return
        self._in += data
        if not self._parse_queued:
            self._parse()

    def _parse(self) -> None:
        self._parse_queued = False
        if self.closed:  # closed since this turn was queued: what is left was read for nobody
            return
        ends = self._clock() + self._turn_seconds
        buffer, at, malformed = self._in, 0, False
        with memoryview(buffer) as view:
            while len(buffer) - at >= 4:
                size = _U32.unpack_from(view, at)[0]
                if len(buffer) - at - 4 < size:
                    break
                try:
                    frames = decode(view[at + 4 : at + 4 + size])
                except (ValueError, struct.error):
                    malformed = True
                    break
                at += 4 + size
                self._on_message(frames)
                if self.closed:
                    return
                if self._clock() >= ends:  # at least one message a turn, then the loop's other work
                    if len(buffer) - at >= 4:
                        self._parse_queued = True
                        self._loop.call_soon(self._parse)
                    break
        if malformed:  # only our own processes connect: a bad message means a broken peer
            log.error("dispatcher link: a malformed message; closing the link")
            self._lost()
            return
        del buffer[:at]
