"""LoopSocket: ZMQ read from an asyncio loop through its edge-triggered descriptor."""

from __future__ import annotations

import asyncio

import zmq

from windve.dispatcher.loop_socket import LoopSocket

# Past ZMQ's default high-water mark (1,000), where a ROUTER would drop and a DEALER refuse.
MESSAGES = 5000


async def _echo_round(tmp_path, per_turn: int) -> list[int]:
    """A DEALER sends MESSAGES at once to a ROUTER that answers each from its read callback."""
    context = zmq.Context()
    address = f"ipc://{tmp_path}/echo"
    replies: list[int] = []
    done = asyncio.Event()

    def echo(frames: list) -> None:
        router.send([frames[0], frames[1]])

    def collect(frames: list) -> None:
        replies.append(int(frames[0]))
        if len(replies) == MESSAGES:
            done.set()

    router = LoopSocket(context.socket(zmq.ROUTER), echo, per_turn=per_turn)
    router.socket.bind(address)
    dealer = LoopSocket(context.socket(zmq.DEALER), collect, per_turn=per_turn)
    dealer.socket.connect(address)
    router.start()
    dealer.start()
    try:
        for number in range(MESSAGES):
            dealer.send([str(number).encode()])
        await asyncio.wait_for(done.wait(), 60)
    finally:
        router.close()
        dealer.close()
        context.term()
    return replies


def test_every_message_is_read_and_answered_in_order_past_the_high_water_mark(tmp_path):
    replies = asyncio.run(_echo_round(tmp_path, per_turn=256))
    assert replies == list(range(MESSAGES))


def test_a_reader_that_stops_each_turn_early_still_reads_everything(tmp_path):
    # One message a turn: whatever is left must be read in later turns, not wait for the
    # descriptor to signal again (it does not: it is edge-triggered and was drained).
    replies = asyncio.run(_echo_round(tmp_path, per_turn=1))
    assert replies == list(range(MESSAGES))
