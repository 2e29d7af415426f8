"""The dispatcher process's side of the hop: front ends' embed requests in, vectors or refusals out.

One listening Unix socket; each front end holds one connection (`FrameLink`), known by its
process id (SO_PEERCRED). Each request is admitted by the queue manager in the step of the
event loop that reads it, so admission stays atomic across front ends. A front end that dies
has its admitted queries cancelled (`forget_client`): nobody will read their answers, and the
slots they hold belong to the clients of the other front ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import time
from collections.abc import Callable

import numpy as np
from prometheus_client import generate_latest

from queue_manager.pool import Request
from queue_manager.protocol import Busy, QueryFailed, ShuttingDown, Unavailable
from windve.dispatcher import messages
from windve.dispatcher.board import DEGRADED, OK, STARTING, UNAVAILABLE, StateBoard
from windve.dispatcher.link import FrameLink
from windve.dispatcher.unix_path import reachable
from windve.service import Runtime

log = logging.getLogger(__name__)

# An answer whose front end has not reported its time within this many seconds is forgotten: its
# client left before the front end read it, and no one saw that latency.
UNREPORTED_SECONDS = 60.0


class DispatcherServer:
    def __init__(
        self,
        address: str,
        board: StateBoard,
        runtime: Callable[[], Runtime | None],
        front_ends: Callable[[], list[int]] = list,
    ) -> None:
        self.address = address
        self._front_ends = front_ends  # pids of the live front-end processes, for /info
        self.peak_in_flight: dict[str, int] = {}  # per pool, since start: admission's bound, observed
        self.board = board
        self._runtime = runtime  # None while the engines load
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with reachable(address) as path:
            self._listener.bind(path)  # before any front end starts: they connect at once
        self._listener.listen(256)
        self._listener.setblocking(False)
        self._links: dict[bytes, FrameLink] = {}
        self._pending: dict[tuple[bytes, int], Request] = {}
        # Answered, waiting for the front end's report of the request's time (messages.DONE), oldest first.
        self._unreported: dict[tuple[bytes, int], tuple[Request, float]] = {}
        self._tasks: list[asyncio.Task] = []
        self.serving: set[bytes] = set()  # front ends that said they answer /embed (for the warm-up probe)
        self.serving_changed = asyncio.Event()  # set when one says so

    def start(self) -> None:
        asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept)
        self._tasks = [asyncio.create_task(self._publish(), name="dispatcher-board")]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        asyncio.get_running_loop().remove_reader(self._listener.fileno())
        self._listener.close()
        for link in list(self._links.values()):
            link.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return
            pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
            client = messages.front_end_identity(pid)
            link = FrameLink(
                conn, lambda frames, client=client: self._receive(client, frames),
                on_close=lambda client=client: self._closed(client),
            )
            link.start()
            old = self._links.get(client)
            if old is not None:
                old.close()
            self._links[client] = link

    def _closed(self, client: bytes) -> None:
        link = self._links.get(client)
        if link is not None and link.closed:  # not a newer connection of the same process
            del self._links[client]

    # ---- the board -------------------------------------------------------------------

    def publish_now(self) -> None:
        runtime = self._runtime()
        if runtime is None or not runtime.accepting or runtime.queue_manager is None:
            self.board.write(ready=False, draining=False, health=STARTING, free_room=0, retry_after=1.0)
            return
        qm = runtime.queue_manager
        serving = qm.serving_pools()
        if not qm.healthy():
            health = UNAVAILABLE if not serving else DEGRADED
        else:
            health = OK if qm.all_instances_healthy() else DEGRADED
        self.board.write(
            ready=True,
            draining=qm.draining,
            health=health,
            free_room=sum(pool.room() for pool in serving),
            retry_after=qm.retry_after(1),
            warming=not runtime.ready,
            live_tail=qm.live_tail(),
        )

    async def _publish(self) -> None:
        from windve.dispatcher.board import REFRESH_SECONDS

        while True:
            self.publish_now()
            await asyncio.sleep(REFRESH_SECONDS)  # the board's refresh period

    # ---- requests --------------------------------------------------------------------

    def _receive(self, client: bytes, frames: list) -> None:
        header = messages.unpack(frames[0])
        try:
            self._handle(client, header)
        except Exception:  # noqa: BLE001 - one bad message must not stop the dispatcher
            log.exception("dispatcher: cannot handle %s", header.get("op"))
            self._answer(client, header.get("id", 0), messages.FAILED, message="dispatcher error")

    def _handle(self, client: bytes, header: dict) -> None:
        op, request_id = header["op"], header["id"]
        if op == messages.EMBED:
            self._embed(client, request_id, header)
        elif op == messages.DONE:
            self._reported(client, header["ids"], header["seconds"])
        elif op == messages.CANCEL:
            self._unreported.pop((client, request_id), None)
            request = self._pending.pop((client, request_id), None)
            runtime = self._runtime()
            if request is not None and runtime is not None:
                runtime.queue_manager.cancel(request)
        elif op == messages.INFO:
            runtime = self._runtime()
            info = runtime.info() if runtime is not None else {"ready": False}
            info["dispatcher"] = {
                "pid": os.getpid(),
                "front_ends": self._front_ends(),
                "peak_in_flight": self.peak_in_flight,
            }
            self._send(client, {"id": request_id, "status": messages.OK, "info": info})
        elif op == messages.METRICS:
            self._send(client, {"id": request_id, "status": messages.OK}, generate_latest())
        elif op == messages.SERVING:
            self.serving.add(client)
            self.serving_changed.set()

    def _embed(self, client: bytes, request_id: int, header: dict) -> None:
        runtime = self._runtime()
        if runtime is None or not runtime.accepting:
            self._answer(client, request_id, messages.UNAVAILABLE, message="the model is still loading", retry=1.0)
            return
        qm = runtime.queue_manager
        if header.get("lacked_room"):
            qm.lacked_room()
        sequences = messages.unpack_sequences(header["lengths"], header["ids"])
        try:
            request = qm.admit(sequences)
        except ShuttingDown as refusal:
            self._answer(client, request_id, messages.DRAINING, message=str(refusal), retry=refusal.retry_after)
            return
        except Busy as refusal:
            self._answer(client, request_id, messages.BUSY, message=str(refusal), retry=refusal.retry_after)
            return
        except Unavailable as refusal:
            self._answer(client, request_id, messages.UNAVAILABLE, message=str(refusal), retry=refusal.retry_after)
            return
        for pool in qm.pools if runtime.ready else ():  # the warm-up probe's depths are not the service's
            if pool.in_flight > self.peak_in_flight.get(pool.name, 0):
                self.peak_in_flight[pool.name] = pool.in_flight
        key = (client, request_id)
        self._pending[key] = request

        def answered(future: asyncio.Future) -> None:
            if self._pending.pop(key, None) is None or future.cancelled():
                return  # cancelled: the front end has gone or its client left
            error = future.exception()
            if error is not None:
                status = messages.FAILED if isinstance(error, QueryFailed) else messages.UNAVAILABLE
                self._answer(client, request_id, status, message=str(error), retry=1.0)
                return
            vectors = future.result()
            self._await_report(key, request)
            count, dim = vectors.shape
            vectors = np.ascontiguousarray(vectors, dtype=np.float32)  # msgpack takes C-ordered buffers only
            queued, computed, served = request.timing()
            header = {"id": request_id, "status": messages.OK, "n": count, "dim": dim, "vectors": vectors.data}
            header.update(queued=queued, computed=computed, served=served)
            self._send(client, header)

        request.future.add_done_callback(answered)

    def _await_report(self, key: tuple[bytes, int], request: Request) -> None:
        """Keep an answered request until its front end says how long its client waited for it."""
        now = time.perf_counter()
        unreported = self._unreported
        unreported[key] = (request, now)
        while True:
            oldest = next(iter(unreported))
            if now - unreported[oldest][1] < UNREPORTED_SECONDS:
                return
            del unreported[oldest]

    def _reported(self, client: bytes, request_ids: list[int], seconds: list[float]) -> None:
        """Depth control's live samples: each answered request's time from its bytes' arrival at the
        front end to its answer back there, as a front end in the dispatcher's process times it
        (client.LocalTicket). Timed here, from admission to the answer leaving, a sample left out
        the answer's wait in the link and in the front end's loop, which grows as front ends fill."""
        runtime = self._runtime()
        qm = runtime.queue_manager if runtime is not None else None
        for request_id, took in zip(request_ids, seconds):
            entry = self._unreported.pop((client, request_id), None)
            if entry is not None and qm is not None:
                qm.record_latency(entry[0], float(took))

    def forget_client(self, client: bytes) -> int:
        """Cancel every admitted query of a front end that has gone; returns how many requests."""
        runtime = self._runtime()
        self.serving.discard(client)
        for key in [key for key in self._unreported if key[0] == client]:
            del self._unreported[key]
        gone = [key for key in self._pending if key[0] == client]
        for key in gone:
            request = self._pending.pop(key)
            if runtime is not None:
                runtime.queue_manager.cancel(request)
        return len(gone)

    def _answer(self, client: bytes, request_id: int, status: str, *, message: str, retry: float = 1.0) -> None:
        self._send(client, {"id": request_id, "status": status, "message": message, "retry_after": retry})

    def _send(self, client: bytes, header: dict, payload: bytes | None = None) -> None:
        link = self._links.get(client)
        if link is None or link.closed:  # the front end has gone: nobody would read it
            return
        link.send([messages.pack(header)] + ([payload] if payload is not None else []))
