"""How a front end reaches the dispatcher: in its own process, or over a Unix socket.

Both clients answer the same calls, so the front end's request path is one:
- `check_room(n, promised)` before any work: BUSY (or 503) at once, costing no engine anything
  (`promised`: room the overload gate has let to requests not yet admitted);
- `submit(sequences, waited)` -> a Ticket, in the caller's own event-loop step (in-process:
  admitted or refused right there, so a refusal costs no task); `await ticket.future`, then
  `ticket.result()` -> float32 [n, dim] or Busy / ShuttingDown / Unavailable / QueryFailed;
  `ticket.cancel()` when the client has gone frees its queries' slots; `ticket.timing()` once
  answered: (mean queue seconds, mean batch seconds, the pools that answered), TEI's timing headers;
- `status()` for /health (never waits behind embedding work), `await info()`,
  `await metrics_text()` for what lives in the dispatcher's process;
- `await serving(address)` once the front end answers HTTP: the dispatcher's warm-up probe may
  go through it (windve.probe).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from queue_manager.protocol import Busy, QueryFailed, ShuttingDown, Unavailable
from windve.dispatcher import messages
from windve.dispatcher.board import DEGRADED, OK, STARTING, UNAVAILABLE, StateBoard
from windve.dispatcher.link import FrameLink
from windve.dispatcher.unix_path import reachable
from windve.probe import Address

if TYPE_CHECKING:
    from queue_manager.manager import QueueManager
    from queue_manager.pool import Request
    from windve.service import Runtime

_GONE = {"status": messages.UNAVAILABLE, "message": "the dispatcher has gone", "retry_after": 1.0}
HEALTH_NAMES = {STARTING: "starting", DEGRADED: "degraded", OK: "ok", UNAVAILABLE: "unhealthy"}
CONTROL_TIMEOUT = 5.0  # /info and /metrics answers from the dispatcher


class LocalTicket:
    """A request admitted by the in-process queue manager."""

    def __init__(self, qm: QueueManager, request: Request, waited: float) -> None:
        self._qm = qm
        self._request = request
        self.future = request.future
        self._since = time.perf_counter() - waited

    def result(self) -> np.ndarray:
        vectors = self.future.result()
        self._qm.record_latency(self._request, time.perf_counter() - self._since)
        return vectors

    def timing(self) -> tuple[float, float, str]:
        return self._request.timing()

    def cancel(self) -> None:
        self._qm.cancel(self._request)


class LocalDispatcher:
    """The dispatcher in the front end's own process (one front end)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def check_room(self, wanted: int, promised: int = 0) -> None:
        self.runtime.queue_manager.check_room(wanted, promised)

    def live_tail(self) -> float | None:
        """The pools' slowest live p99 in seconds (QueueManager.live_tail), None before any answer."""
        qm = self.runtime.queue_manager
        return None if qm is None else qm.live_tail()

    def submit(self, sequences: Sequence[np.ndarray], waited: float = 0.0) -> LocalTicket:
        qm = self.runtime.queue_manager
        return LocalTicket(qm, qm.admit(sequences), waited)

    def status(self) -> dict:
        runtime = self.runtime
        if not runtime.ready:
            return {"status": "starting"}
        qm = runtime.queue_manager
        if qm.draining:
            return {"status": "draining"}
        if not qm.healthy():
            return {"status": "unhealthy"}
        return {"status": "ok" if qm.all_instances_healthy() else "degraded"}

    async def serving(self, address: Address | None) -> None:
        """The front end answers at `address` (None: no HTTP server listens): probe through it."""
        await self.runtime.finish_start(address)

    async def info(self) -> dict:
        return self.runtime.info()

    async def metrics_text(self) -> bytes:
        return b""  # the dispatcher's metrics are in this process's default registry already

    async def close(self) -> None:
        await self.runtime.close()


class RemoteTicket:
    """A request sent to the dispatcher in another process; admitted or refused there."""

    def __init__(self, client: RemoteDispatcher, request_id: int, future: asyncio.Future, waited: float) -> None:
        self._client = client
        self._id = request_id
        self.future = future
        self._since = time.perf_counter() - waited

    def result(self) -> np.ndarray:
        header, payload = self.future.result()
        status = header["status"]
        if status == messages.OK:
            # Timed here, as LocalTicket times it: the answer's wait in this front end's socket and
            # loop is the client's wait too, and it is what grows when the front ends are full.
            self._client.report(self._id, time.perf_counter() - self._since)
            return messages.unpack_vectors(header["vectors"], header["n"], header["dim"])
        retry = header.get("retry_after", 1.0)
        if status == messages.BUSY:
            raise Busy(retry_after=retry, message=header["message"])
        if status == messages.DRAINING:
            raise ShuttingDown(retry_after=retry, message=header["message"])
        if status == messages.UNAVAILABLE:
            raise Unavailable(retry_after=retry, message=header["message"])
        raise QueryFailed(header["message"])

    def timing(self) -> tuple[float, float, str]:
        header = self.future.result()[0]
        return header["queued"], header["computed"], header["served"]

    def cancel(self) -> None:
        self._client.forget(self._id)


class RemoteDispatcher:
    """The dispatcher in the `windve serve` parent, reached over its Unix socket at `address`
    (connected by `start`, from the running loop)."""

    def __init__(self, address: str, board_path: Path) -> None:
        self.board = StateBoard(board_path)
        self.address = address
        self._link: FrameLink | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        # A request was refused for want of room since the last submit: the dispatcher's depth
        # control counts the pools as full (QueueManager.lacked_room), told with the next submit.
        self._lacked_room = False
        # Answered requests' times, sent to the dispatcher once a loop turn (messages.DONE).
        self._done_ids: list[int] = []
        self._done_seconds: list[float] = []

    def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with reachable(self.address) as path:
                sock.connect(path)  # the dispatcher listens before any front end starts
        except OSError:
            sock.close()
            raise
        self._link = FrameLink(sock, self._receive, on_close=self._lost)
        self._link.start()

    def _lost(self) -> None:
        """The dispatcher has gone: every waiting request is answered unavailable, now."""
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_result((_GONE, []))

    def _receive(self, frames: list) -> None:
        header = messages.unpack(frames[0])
        future = self._waiting.pop(header["id"], None)
        if future is not None and not future.done():
            future.set_result((header, frames[1:]))

    def _send(self, header: dict, *payload) -> asyncio.Future:
        """Queue it (written at the end of this turn); the answer resolves the returned future."""
        request_id = header["id"] = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        if self._link is None or self._link.closed:
            future.set_result((_GONE, []))
            return future
        self._waiting[request_id] = future
        self._link.send([messages.pack(header), *payload])
        return future

    async def _ask(self, header: dict) -> tuple[dict, list]:
        future = self._send(header)
        try:
            answer = await future
        finally:
            self._waiting.pop(header["id"], None)
        if answer[0]["status"] != messages.OK:
            raise ConnectionError(answer[0].get("message", "the dispatcher did not answer"))
        return answer

    def forget(self, request_id: int) -> None:
        """The client has gone: drop the wait and tell the dispatcher to free the slots."""
        if self._waiting.pop(request_id, None) is not None and self._link is not None:
            self._link.send([messages.pack({"op": messages.CANCEL, "id": request_id})])

    def report(self, request_id: int, seconds: float) -> None:
        """Request `request_id` was answered `seconds` after its bytes arrived: a live latency
        sample for the dispatcher's depth control, sent with the others of this loop turn."""
        if not self._done_ids:
            asyncio.get_running_loop().call_soon(self._send_reports)
        self._done_ids.append(request_id)
        self._done_seconds.append(seconds)

    def _send_reports(self) -> None:
        ids, seconds = self._done_ids, self._done_seconds
        self._done_ids, self._done_seconds = [], []
        if ids and self._link is not None and not self._link.closed:
            self._link.send([messages.pack({"op": messages.DONE, "id": 0, "ids": ids, "seconds": seconds})])

    def check_room(self, wanted: int, promised: int = 0) -> None:
        state = self.board.read()
        if not state.alive:
            raise Unavailable(retry_after=1.0, message="the dispatcher is not answering")
        if not state.ready:
            raise Unavailable(retry_after=1.0, message="the model is still loading; retry shortly")
        if state.health == UNAVAILABLE:
            raise Unavailable(retry_after=1.0, message="no engine instance is healthy; retry shortly")
        if state.draining:
            raise ShuttingDown(retry_after=state.retry_after, message="the service is shutting down")
        if state.free_room - promised <= 0:
            self._lacked_room = True
            raise Busy(retry_after=state.retry_after)

    def live_tail(self) -> float | None:
        """The pools' slowest live p99 in seconds, as the board has it; None before any answer."""
        return self.board.read().live_tail

    def submit(self, sequences: Sequence[np.ndarray], waited: float = 0.0) -> RemoteTicket:
        lengths, ids = messages.pack_sequences(sequences)
        header = {"op": messages.EMBED, "waited": waited, "lengths": lengths, "ids": ids}
        if self._lacked_room:
            header["lacked_room"], self._lacked_room = True, False
        future = self._send(header)
        return RemoteTicket(self, header["id"], future, waited)

    def status(self) -> dict:
        state = self.board.read()
        if not state.alive:
            return {"status": "unhealthy", "error": "the dispatcher is not answering"}
        if not state.ready or state.warming:
            return {"status": "starting"}
        if state.draining:
            return {"status": "draining"}
        return {"status": HEALTH_NAMES[state.health]}

    async def serving(self, address: Address | None) -> None:
        """Tell the dispatcher that this front end answers /embed: its warm-up probe waits for every
        front end, as the probe's connections may reach any of them. `address`: the parent knows it."""
        if self._link is not None:
            self._link.send([messages.pack({"op": messages.SERVING, "id": 0})])

    async def info(self) -> dict:
        header, _ = await asyncio.wait_for(self._ask({"op": messages.INFO}), CONTROL_TIMEOUT)
        return header["info"]

    async def metrics_text(self) -> bytes:
        _, payload = await asyncio.wait_for(self._ask({"op": messages.METRICS}), CONTROL_TIMEOUT)
        return payload[0]

    async def close(self) -> None:
        if self._link is not None:
            self._link.close()
        self.board.close()
