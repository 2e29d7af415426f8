"""A ZMQ socket served by an asyncio loop without a future per message (both ends of the hop).

pyzmq's asyncio socket makes a future and a loop callback for every message received and sent.
On the H100 host that wrapper took ~30 % of the dispatcher's main thread at ~4,500 requests/s
(bench/SERVED.md); here it is a plain socket whose descriptor the loop watches. When the
descriptor signals, every waiting message is read with NOBLOCK, for at most `turn_seconds` of
one loop turn, so that an engine's answer and the batch it frees the engine for wait behind a
millisecond of reading, not behind a burst of hundreds of messages (bench/handoff.py: with the
loop busy in 10 ms steps an engine process with two batches in flight computed 45 % of the
time). Sends are NOBLOCK too.
Messages arrive as lists of bytes: the frames are small (a request's token ids, its vectors),
and a zero-copy zmq.Frame costs more to make than such a copy. Whether one waits is asked of
ZMQ_EVENTS rather than learnt from a zmq.Again, whose making costs as much as a message.

ZMQ's descriptor is edge-triggered, and a send can take in waiting messages without signalling
it: after each send, ZMQ_EVENTS says whether a read must be scheduled.

No high-water marks: ZMQ drops a ROUTER's message to a peer whose queue is full, and a DEALER
refuses to send; the queue manager's depths bound what is in flight already, so a full queue
would only lose admitted work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import zmq

READ_TURN_SECONDS = 0.001


class LoopSocket:
    def __init__(
        self,
        socket: zmq.Socket,
        on_message: Callable[[list], None],
        turn_seconds: float = READ_TURN_SECONDS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        self.socket = socket
        self._on_message = on_message
        self._turn_seconds = turn_seconds
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False

    def start(self) -> None:
        """Watch the socket from the running loop; messages that came before are read next turn."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.socket.getsockopt(zmq.FD), self._signalled)
        self._schedule()

    def send(self, frames: list) -> None:
        """Queue `frames` at once (raises zmq.ZMQError when the socket cannot take them)."""
        self.socket.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
        if self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._schedule()

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.socket.getsockopt(zmq.FD))
        self.socket.close(0)

    def _signalled(self) -> None:
        if not self._scheduled:  # else a turn is queued already: a second one would double this step
            self._read()

    def _read(self) -> None:
        self._scheduled = False
        ends = self._clock() + self._turn_seconds
        while not self.socket.closed and self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:  # EVENTS said one waits; never seen, but never block the loop
                return
            self._on_message(frames)
            if self._clock() >= ends:  # at least one message a turn, then the loop's other work
                self._schedule()  # more may wait: read them next turn
                return

    def _schedule(self) -> None:
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._read)
