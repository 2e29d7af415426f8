"""How a slot's queue becomes batches: which queued queries go together, and when one is worth
sending while another computes. Pure functions of the queue, so the queue manager's loop stays
about order and bookkeeping."""

from __future__ import annotations

import math
from collections import deque

from queue_manager.pool import InstanceSlot, Query

LOOKAHEAD = 128  # queued queries a batch looks past the oldest for companions of similar length
MAX_LENGTH_SPREAD = 1.5  # longest / shortest query in one batch


def take_batch(queue: deque[Query], max_size: int, max_tokens: int) -> list[Query]:
    """Take from `queue` the oldest query, joined by queued queries of similar length.

    Up to `max_size` queries and `max_tokens` padded tokens. A batch is padded to its longest
    query, so a 16-token query batched with a 256-token one costs 256: companions are taken in
    FIFO order from the next LOOKAHEAD queries, skipping those whose length would stretch the
    batch's longest/shortest ratio past MAX_LENGTH_SPREAD. The oldest query always goes first, so
    nothing waits behind more than a few batches.
    """
    head = queue.popleft()
    batch = [head]
    longest = shortest = head.tokens
    skipped = 0
    while skipped < min(len(queue), LOOKAHEAD) and len(batch) < max_size:
        candidate = queue[skipped]
        tokens = candidate.tokens
        wider_longest, wider_shortest = max(longest, tokens), min(shortest, tokens)
        fits = (len(batch) + 1) * wider_longest <= max_tokens
        if fits and wider_longest <= MAX_LENGTH_SPREAD * wider_shortest:
            del queue[skipped]
            batch.append(candidate)
            longest, shortest = wider_longest, wider_shortest
        elif not fits and tokens <= longest:
            break  # the batch is full of tokens: nothing queued can join it
        else:
            skipped += 1
    return batch


def worth_sending_ahead(slot: InstanceSlot) -> bool:
    """Whether the slot's queue holds the instance's `ahead_fill` of a full batch (counted in
    queries of the oldest one's length; any queue when it is 0): a batch sent ahead waits in the
    engine's pipe as it is, and the queries behind it cannot join it."""
    pool, queue = slot.pool, slot.queue
    full = max(1, min(pool.max_batch_size, pool.max_batch_tokens // max(1, queue[0].tokens)))
    return len(queue) >= max(1, math.ceil(full * slot.ahead_fill))
