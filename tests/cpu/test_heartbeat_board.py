"""The heartbeat board's age: real silence counts, an impossible stamp does not."""

from __future__ import annotations

import logging
import time

from windve.heartbeat import HeartbeatBoard


def test_a_stale_stamp_is_silence_and_a_fresh_one_is_not():
    before = time.monotonic()  # the board's clock
    board = HeartbeatBoard()
    try:
        # made now: a fresh worker has until the timeout to beat. Its age counts from its making,
        # so it is at most the time since `before`, however slow this machine.
        assert 0.0 <= board.age() <= time.monotonic() - before
        board.created -= 100.0  # as if made 100 s ago
        board._record.write(board.created + 1.0)  # and last beaten 99 s ago
        age = board.age()
        rounding = 1e-6  # the stamps' float arithmetic
        assert 99.0 - rounding <= age <= 99.0 + (time.monotonic() - before) + rounding
    finally:
        board.close()


def test_a_stamp_from_before_the_board_or_the_future_is_not_silence(caplog):
    board = HeartbeatBoard()
    try:
        with caplog.at_level(logging.WARNING, logger="windve.heartbeat"):
            board._record.write(0.0)  # what a torn read once gave: the machine's uptime of silence
            assert board.age() == 0.0
            board._record.write(time.monotonic() + 3600)
            assert board.age() == 0.0
        warnings = [record for record in caplog.records if "impossible stamp" in record.getMessage()]
        assert len(warnings) == 1  # once per board, with the raw values
        assert "0.000000" in warnings[0].getMessage()
    finally:
        board.close()


def test_a_loop_beat_stamps_while_the_loop_runs_and_ages_while_it_stalls():
    """A front end beats from its event loop: a loop held by one callback shows as silence, and a
    long step whose callbacks read (progress) does not."""
    import asyncio
    import os

    from windve.heartbeat import LoopBeat

    board = HeartbeatBoard()

    async def scenario() -> tuple[float, float, float, float, float]:
        made = board.stamp()
        beat = LoopBeat(os.dup(board.fd), period=0.02)
        beaten = board.stamp()  # the first beat is at once
        deadline = time.monotonic() + 10
        while board.stamp() == beaten and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # turning the loop until the timer beats again, bounded
        again = board.stamp()
        time.sleep(0.3)  # the loop held by one callback, as a stalled front end's is
        stalled = board.age()
        # One long step of many callbacks, each reading a request: progress at every one.
        slowest, longest_callback = 0.0, 0.0
        end = time.monotonic() + 0.3
        while (started := time.monotonic()) < end:
            beat.progress()
            slowest = max(slowest, board.age())
            time.sleep(0.001)  # one callback's work
            longest_callback = max(longest_callback, time.monotonic() - started)
        beat.stop()
        # The stamp is at most a period and one callback old, whatever this machine's speed.
        return made, beaten, again, stalled, slowest - longest_callback

    try:
        made, beaten, again, stalled, past_a_callback = asyncio.run(scenario())
        assert made < beaten < again  # the loop beats, and beats again while it turns
        assert stalled >= 0.3  # no beat while it did not turn
        assert past_a_callback <= 0.02 + 0.005  # a step that reads keeps the stamp a period fresh
    finally:
        board.close()
