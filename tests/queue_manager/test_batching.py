"""take_batch on its own: which queued queries leave together, for any queue and limits."""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from queue_manager.batching import LOOKAHEAD, MAX_LENGTH_SPREAD, take_batch
from queue_manager.pool import Pool, Query, Request


def _queue(lengths: list[int]) -> deque[Query]:
    loop = asyncio.new_event_loop()
    try:
        pool = Pool(name="cpu", depth=len(lengths))
        return deque(Query(Request(1, loop), index, np.zeros(n, np.int64), pool) for index, n in enumerate(lengths))
    finally:
        loop.close()


@given(
    lengths=st.lists(st.integers(1, 512), min_size=1, max_size=200),
    max_size=st.integers(1, 64),
    max_tokens=st.integers(1, 16384),
)
def test_a_batch_is_the_oldest_query_and_companions_within_every_limit(lengths, max_size, max_tokens):
    queue = _queue(lengths)
    before = list(queue)
    batch = take_batch(queue, max_size, max_tokens)
    assert batch[0] is before[0]  # the oldest always leaves, even alone over the token limit
    assert len(batch) <= max_size
    longest, shortest = max(q.tokens for q in batch), min(q.tokens for q in batch)
    assert len(batch) == 1 or len(batch) * longest <= max_tokens
    assert longest <= MAX_LENGTH_SPREAD * shortest
    # Companions come from the lookahead window in FIFO order; nothing is lost, duplicated or
    # reordered among those left.
    assert all(before.index(q) <= LOOKAHEAD + len(batch) - 1 for q in batch)
    assert [before.index(q) for q in batch] == sorted(before.index(q) for q in batch)
    left = [q for q in before if q not in batch]
    assert list(queue) == left


def test_companions_of_another_length_wait_for_their_own_batch():
    queue = _queue([16, 256, 20, 240, 16, 200, 18])
    first = take_batch(queue, 8, 4096)
    assert [q.index for q in first] == [0, 2, 4, 6]
    assert [q.index for q in take_batch(queue, 8, 4096)] == [1, 3, 5]
    assert not queue
