"""LoopSocket: ZMQ read from an asyncio loop through its edge-triggered descriptor."""

from __future__ import annotations

import asyncio
import itertools

import zmq

from windve.dispatcher.loop_socket import LoopSocket

# Past ZMQ's default high-water mark (1,000), where a ROUTER would drop and a DEALER refuse.
MESSAGES = 5000


def _ticks():
    """A clock that moves one second each time it is read: a turn of N seconds reads N messages."""
    return itertools.count().__next__


async def _echo_round(tmp_path, turn_seconds: float, clock=None) -> tuple[list[int], list[int]]:
    """A DEALER sends MESSAGES at once to a ROUTER that answers each from its read callback.

    Returns the replies in the order read, and how many messages the router had read at each of
    the loop's steps (a callback that puts itself back on the loop at every step notes it)."""
    context = zmq.Context()
    address = f"ipc://{tmp_path}/echo"
    replies: list[int] = []
    echoed = 0
    read_by_step: list[int] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def echo(frames: list) -> None:
        nonlocal echoed
        echoed += 1
        router.send([frames[0], frames[1]])

    def collect(frames: list) -> None:
        replies.append(int(frames[0]))
        if len(replies) == MESSAGES:
            done.set()

    def note_step() -> None:
        read_by_step.append(echoed)
        if not done.is_set():
            loop.call_soon(note_step)

    def timing() -> dict:  # each socket its own clock
        return {"turn_seconds": turn_seconds} | ({"clock": clock()} if clock else {})

    router = LoopSocket(context.socket(zmq.ROUTER), echo, **timing())
    router.socket.bind(address)
    dealer = LoopSocket(context.socket(zmq.DEALER), collect, **timing())
    dealer.socket.connect(address)
    router.start()
    dealer.start()
    try:
        for number in range(MESSAGES):
            dealer.send([str(number).encode()])
        note_step()
        await asyncio.wait_for(done.wait(), 60)
    finally:
        router.close()
        dealer.close()
        context.term()
    return replies, read_by_step


def test_every_message_is_read_and_answered_in_order_past_the_high_water_mark(tmp_path):
    replies, _ = asyncio.run(_echo_round(tmp_path, turn_seconds=1.0))
    assert replies == list(range(MESSAGES))


def test_a_reader_that_stops_each_turn_early_still_reads_everything(tmp_path):
    # One message a turn: whatever is left must be read in later turns, not wait for the
    # descriptor to signal again (it does not: it is edge-triggered and was drained).
    replies, _ = asyncio.run(_echo_round(tmp_path, turn_seconds=1, clock=_ticks))
    assert replies == list(range(MESSAGES))


def test_a_read_turn_ends_when_its_time_is_up_and_the_loop_runs_its_other_work(tmp_path):
    # Three ticks a turn: at most three messages between two steps of the loop, however many wait.
    replies, read_by_step = asyncio.run(_echo_round(tmp_path, turn_seconds=3, clock=_ticks))
    assert replies == list(range(MESSAGES))
    steps = [later - earlier for earlier, later in itertools.pairwise(read_by_step)]
    assert max(steps) == 3
