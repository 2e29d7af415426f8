"""The heartbeat board's age: real silence counts, an impossible stamp does not."""

from __future__ import annotations

import logging
import time

from windve.engine_process.heartbeat import HeartbeatBoard


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
        with caplog.at_level(logging.WARNING, logger="windve.engine_process.heartbeat"):
            board._record.write(0.0)  # what a torn read once gave: the machine's uptime of silence
            assert board.age() == 0.0
            board._record.write(time.monotonic() + 3600)
            assert board.age() == 0.0
        warnings = [record for record in caplog.records if "impossible stamp" in record.getMessage()]
        assert len(warnings) == 1  # once per board, with the raw values
        assert "0.000000" in warnings[0].getMessage()
    finally:
        board.close()
