"""The heartbeat board's age: real silence counts, an impossible stamp does not."""

from __future__ import annotations

import logging
import time

from windve.heartbeat import HeartbeatBoard


def test_a_stale_stamp_is_silence_and_a_fresh_one_is_not():
    board = HeartbeatBoard()
    try:
        assert board.age() < 1.0  # made now: a fresh worker has until the timeout to beat
        board.created -= 100.0  # as if made 100 s ago
        board._record.write(board.created + 1.0)  # and last beaten 99 s ago
        assert 98.0 < board.age() < 100.0
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


def test_a_loop_beat_stamps_while_the_loop_turns_and_ages_while_it_stalls():
    """A front end beats from its event loop: a loop held by one callback shows as silence."""
    import asyncio
    import os

    from windve.heartbeat import beat_on_loop

    board = HeartbeatBoard()

    async def scenario() -> tuple[float, float, float, float]:
        made = board.stamp()
        stop = beat_on_loop(os.dup(board.fd), period=0.02)
        beaten = board.stamp()  # the first beat is at once
        deadline = time.monotonic() + 10
        while board.stamp() == beaten and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # turning the loop until the next beat, bounded
        again = board.stamp()
        time.sleep(0.3)  # the loop held by one callback, as a stalled front end's is
        stalled = board.age()
        stop()
        return made, beaten, again, stalled

    try:
        made, beaten, again, stalled = asyncio.run(scenario())
        assert made < beaten < again  # the loop beats, and beats again while it turns
        assert stalled >= 0.3  # no beat while it did not turn
    finally:
        board.close()
