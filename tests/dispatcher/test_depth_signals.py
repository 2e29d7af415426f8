"""What depth control and the front ends tell each other across processes: a remote front end that
refused a request for want of room says so with its next request (QueueManager.lacked_room), and
the state board carries the pools' live p99 to the front ends (the slow lane's budget, gate.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from queue_manager.protocol import Busy
from tests.dispatcher.fake_dispatcher import connected_front_end
from windve.dispatcher import messages
from windve.dispatcher.board import OK, StateBoard
from windve.dispatcher.client import RemoteDispatcher


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
