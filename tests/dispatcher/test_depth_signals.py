"""What depth control and the front ends tell each other across processes: a remote front end that
refused a request for want of room says so with its next request (QueueManager.lacked_room), and
the state board carries the pools' live p99 to the front ends (the slow lane's budget, gate.py), and
the front ends time the answers that depth control samples."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest

from queue_manager.manager import QueueManager
from queue_manager.protocol import Busy
from tests.dispatcher.fake_dispatcher import connected_front_end
from tests.queue_manager.doubles import InstantInstance
from windve.dispatcher import messages
from windve.dispatcher.board import OK, StateBoard
from windve.dispatcher.client import RemoteDispatcher
from windve.dispatcher.server import DispatcherServer


def test_a_refusal_for_room_rides_on_the_next_request(tmp_path):
    board = StateBoard(tmp_path / "board", create=True)
    address = str(tmp_path / "dispatcher.sock")

    async def body() -> list[bool]:
        seen = []
        received: asyncio.Queue = asyncio.Queue()
        async with connected_front_end(address, tmp_path / "board", received.put_nowait) as (front_end, _):
            for free_room in (0, 8, 8):
                board.write(ready=True, draining=False, health=OK, free_room=free_room, retry_after=1.0)
                if free_room == 0:
                    with pytest.raises(Busy):
                        front_end.check_room(1)
                else:
                    front_end.check_room(1)
                front_end.submit([np.array([101, 102], dtype=np.int32)])
                frames = await asyncio.wait_for(received.get(), 10)
                seen.append(bool(messages.unpack(frames[0]).get("lacked_room")))
        return seen

    try:
        # The first request after the refusal carries it, once.
        assert asyncio.run(body()) == [True, False, False]
    finally:
        board.close()


@pytest.mark.parametrize("tail", [None, 0.612])
def test_the_board_carries_the_pools_live_tail(tmp_path, tail):
    board = StateBoard(tmp_path / "board", create=True)
    front_end = RemoteDispatcher(str(tmp_path / "d.sock"), tmp_path / "board")
    try:
        board.write(ready=True, draining=False, health=OK, free_room=3, retry_after=1.0, live_tail=tail)
        assert front_end.live_tail() == tail
    finally:
        asyncio.run(front_end.close())
        board.close()


def test_a_remote_front_ends_wait_for_its_answer_is_in_the_live_sample(tmp_path):
    """Depth control's live sample of a request served through a remote front end runs from its
    bytes' arrival to the answer back in that front end: the time an answer waits for a busy front
    end's loop is the client's too. (Timed in the dispatcher, it ended when the answer left.)"""
    board = StateBoard(tmp_path / "board", create=True)
    qm = QueueManager([("cpu", 4, [InstantInstance("cpu-0")])], slo=1.0)
    runtime = SimpleNamespace(accepting=True, ready=True, queue_manager=qm)
    server = DispatcherServer(str(tmp_path / "d.sock"), board, lambda: runtime)
    waited, busy = 0.2, 0.3

    async def body() -> list[float]:
        await qm.start()
        server.start()
        front_end = RemoteDispatcher(str(tmp_path / "d.sock"), tmp_path / "board")
        front_end.start()
        try:
            ticket = front_end.submit([np.array([101, 7, 102], dtype=np.int32)], waited=waited)
            await asyncio.wait_for(asyncio.shield(ticket.future), 10)
            time.sleep(busy)  # the front end's loop is busy with other requests before it reads this answer
            ticket.result()
            control = qm.pools[0].control
            for _ in range(1000):  # until the report has crossed the link
                if control.recent:
                    break
                await asyncio.sleep(0.01)
            return [sample.seconds for sample in control.recent]
        finally:
            await front_end.close()
            await server.close()
            await qm.close()

    try:
        samples = asyncio.run(body())
    finally:
        board.close()
    assert len(samples) == 1
    assert samples[0] >= waited + busy
