"""FrameLink: messages of frames over a Unix stream socket, read and written by an asyncio loop."""

from __future__ import annotations

import asyncio
import itertools
import socket

import pytest

from windve.dispatcher.link import FrameLink, decode, encode

MESSAGES = 5000


def _ticks():
    """A clock that moves one second each time it is read: a turn of N seconds reads N messages."""
    return itertools.count().__next__


async def _echo_round(turn_seconds: float, clock=None, payload: bytes = b"") -> tuple[list[int], list[int]]:
    """One end sends MESSAGES at once to the other, which answers each from its read callback.

    Returns the replies in the order read, and how many messages the echoing end had read at each
    of the loop's steps (a callback that puts itself back on the loop at every step notes it)."""
    near, far = socket.socketpair()
    replies: list[int] = []
    echoed = 0
    read_by_step: list[int] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def echo(frames: list) -> None:
        nonlocal echoed
        echoed += 1
        echoer.send(frames)

    def collect(frames: list) -> None:
        assert frames[1] == payload
        replies.append(int(frames[0]))
        if len(replies) == MESSAGES:
            done.set()

    def note_step() -> None:
        read_by_step.append(echoed)
        if not done.is_set():
            loop.call_soon(note_step)

    def timing() -> dict:  # each end its own clock
        return {"turn_seconds": turn_seconds} | ({"clock": clock()} if clock else {})

    echoer = FrameLink(far, echo, **timing())
    sender = FrameLink(near, collect, **timing())
    echoer.start()
    sender.start()
    try:
        for number in range(MESSAGES):
            sender.send([str(number).encode(), payload])
        note_step()
        await asyncio.wait_for(done.wait(), 60)
    finally:
        echoer.close()
        sender.close()
    return replies, read_by_step


def test_frames_survive_the_wire_format():
    frames = [b"header", b"", memoryview(bytes(range(256)) * 7)]
    wire = encode(frames)
    assert decode(memoryview(wire)[4:]) == [b"header", b"", bytes(range(256)) * 7]
    with pytest.raises(ValueError, match="do not fill"):
        decode(memoryview(wire)[4:-1])


def test_every_message_is_read_and_answered_in_order():
    replies, _ = asyncio.run(_echo_round(turn_seconds=1.0))
    assert replies == list(range(MESSAGES))


def test_messages_larger_than_the_sockets_buffers_arrive_whole():
    # 5,000 x 16 KB queued in one turn: far past what the socket takes at once, so the sender
    # writes as the reader drains, and the reader sees messages split across reads.
    replies, _ = asyncio.run(_echo_round(turn_seconds=1.0, payload=bytes(range(256)) * 64))
    assert replies == list(range(MESSAGES))


def test_a_reader_that_stops_each_turn_early_still_reads_everything():
    # One message a turn: whatever is buffered must be read in later turns, not wait for the
    # socket to signal again (it does not when nothing more arrives).
    replies, _ = asyncio.run(_echo_round(turn_seconds=1, clock=_ticks))
    assert replies == list(range(MESSAGES))


def test_a_read_turn_ends_when_its_time_is_up_and_the_loop_runs_its_other_work():
    # Three ticks a turn: at most three messages between two steps of the loop, however many wait.
    replies, read_by_step = asyncio.run(_echo_round(turn_seconds=3, clock=_ticks))
    assert replies == list(range(MESSAGES))
    steps = [later - earlier for earlier, later in itertools.pairwise(read_by_step)]
    assert max(steps) == 3


def test_the_peer_going_away_closes_the_link_and_says_so():
    async def body() -> tuple[list, bool]:
        near, far = socket.socketpair()
        got: list = []
        gone = asyncio.Event()
        link = FrameLink(near, got.append, on_close=gone.set)
        link.start()
        far.sendall(encode([b"last words"]))
        far.close()
        await asyncio.wait_for(gone.wait(), 10)
        link.send([b"to nobody"])  # dropped, not raised: nobody would read it
        return got, link.closed

    assert asyncio.run(body()) == ([[b"last words"]], True)


def test_a_malformed_message_closes_the_link():
    async def body() -> bool:
        near, far = socket.socketpair()
        gone = asyncio.Event()
        link = FrameLink(near, lambda frames: None, on_close=gone.set)
        link.start()
        far.sendall(b"\x08\x00\x00\x00" + b"\x05\x00\x00\x00" + b"\x00\x00\x00\x00")  # 5 frames in 8 bytes
        await asyncio.wait_for(gone.wait(), 10)
        far.close()
        return link.closed

    assert asyncio.run(body())


def test_a_link_closed_between_read_turns_hands_over_nothing_more():
    async def body() -> list:
        near, far = socket.socketpair()
        got: list = []
        first = asyncio.Event()
        loop = asyncio.get_running_loop()

        def first_closes(frames: list) -> None:
            got.append(frames)
            first.set()
            loop.call_soon(link.close)  # before the next read turn, which is queued after this

        link = FrameLink(near, first_closes, turn_seconds=0.0)  # one message a turn
        link.start()
        far.sendall(encode([b"1"]) + encode([b"2"]) + encode([b"3"]))
        await asyncio.wait_for(first.wait(), 10)
        for _ in range(5):  # loop steps enough for the queued read turns to run
            await asyncio.sleep(0)
        far.close()
        return got

    assert asyncio.run(body()) == [[b"1"]]
