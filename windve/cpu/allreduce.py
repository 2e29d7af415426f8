"""All-reduce (sum) and batch broadcast between the TP ranks of one instance, in shared memory.

Layout of the segment (every control word in its own 128-byte cell, so ranks never
write the same cache line; 128 covers ARM parts with 128-byte lines):

    counters   world cells        rank r's last published reduce round (uint64)
    pair sems  world*world cells  sem[s][r]: "rank s published a round" for receiver r
    bcast sems world cells        sem[r]: "rank 0 published a batch" for receiver r
    inputs     2 buffers          rank 0's request bytes for even/odd batches
    slots      2 x world slots    float32 partial sums, per buffer and rank

One reduce round, on every rank: write the partial into my slot of buffer (round % 2),
store my counter, post sem[me][peer] for each peer, take sem[peer][me] from each peer,
then sum all slots of that buffer in rank order (so every rank gets bit-identical
replicated activations). The post/wait pair orders the data (see shm.py): no rank reads
a slot before its writer posted. Double buffering makes the single barrier per round
enough: a rank can start round r+2 (overwriting buffer r % 2) only after taking every
peer's round r+1 post, and a peer posts r+1 only after it finished reading round r. The
input buffers follow the same argument with batches (every batch runs >= 1 reduce).
Sequence counters are not the synchronisation; they check it (a peer's counter must have
reached the round whose post we took) and say in a timeout which rank fell behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from windve.cpu.layout import CELL, GroupLayout
from windve.cpu.shm import ProcessSemaphore, Segment


class PeerTimeout(TimeoutError):
    """A peer rank did not publish in time: it died or hangs; the batch must fail."""


def create_group_segment(layout: GroupLayout) -> Segment:
    """The parent's side: a fresh segment with every semaphore initialised to zero."""
    segment = Segment.create(layout.size)
    try:
        for sem in _pair_sems(segment, layout) + _bcast_sems(segment, layout):
            sem.init(0)
    except BaseException:
        segment.unlink()
        segment.close()
        raise
    return segment


def _pair_sems(segment: Segment, layout: GroupLayout) -> list[ProcessSemaphore]:
    base = segment.address + layout.sems_offset
    return [ProcessSemaphore(base + i * CELL) for i in range(layout.world * layout.world)]


def _bcast_sems(segment: Segment, layout: GroupLayout) -> list[ProcessSemaphore]:
    base = segment.address + layout.bcast_offset
    return [ProcessSemaphore(base + i * CELL) for i in range(layout.world)]


def read_counters(segment: Segment, layout: GroupLayout) -> list[int]:
    """Every rank's last published round (diagnostics: is the group making progress?)."""
    view = np.ndarray((layout.world,), np.uint64, segment.mm, 0, (CELL,))
    return [int(value) for value in view]


class GroupComm:
    """One rank's handle on the group: all_reduce for every rank, broadcast from rank 0."""

    def __init__(self, path: Path, layout: GroupLayout, rank: int, timeout: float) -> None:
        if not 0 <= rank < layout.world:
            raise ValueError(f"rank {rank} outside a group of {layout.world}")
        self.layout = layout
        self.rank = rank
        self.timeout = timeout
        self.segment = Segment.attach(path, layout.size)
        mm, world = self.segment.mm, layout.world
        self._counters = np.ndarray((world,), np.uint64, mm, 0, (CELL,))
        pairs = _pair_sems(self.segment, layout)
        self._peers = [peer for peer in range(world) if peer != rank]
        self._outgoing = [pairs[rank * world + peer] for peer in self._peers]
        self._incoming = [(peer, pairs[peer * world + rank]) for peer in self._peers]
        self._bcast = _bcast_sems(self.segment, layout)
        self._slots = [
            [
                np.ndarray(
                    (layout.reduce_elems,),
                    np.float32,
                    mm,
                    layout.slot_offset + (buffer * world + r) * layout.slot_stride,
                )
                for r in range(world)
            ]
            for buffer in range(2)
        ]
        self._inputs = [
            memoryview(mm)[layout.input_offset + b * layout.input_stride :][: layout.input_bytes]
            for b in range(2)
        ]
        self._round = 0
        self._batch = 0

    def all_reduce(self, partial: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Sum of every rank's `partial` (float32, any shape), identical on every rank."""
        flat = np.ascontiguousarray(partial, dtype=np.float32).reshape(-1)
        result = np.empty_like(flat) if out is None else out.reshape(-1)
        cap = self.layout.reduce_elems
        for start in range(0, flat.size, cap):
            stop = min(start + cap, flat.size)
            self._reduce_chunk(flat[start:stop], result[start:stop])
        return result.reshape(partial.shape)

    def _reduce_chunk(self, src: np.ndarray, dst: np.ndarray) -> None:
        self._round += 1
        slots = self._slots[self._round & 1]
        count = src.size
        slots[self.rank][:count] = src
        self._counters[self.rank] = self._round
        for sem in self._outgoing:
            sem.post()
        deadline = time.monotonic() + self.timeout
        for peer, sem in self._incoming:
            if not sem.acquire(deadline):
                raise PeerTimeout(
                    f"rank {self.rank}: all-reduce round {self._round} timed out after "
                    f"{self.timeout:g} s waiting for rank {peer} (its last published round is "
                    f"{int(self._counters[peer])})"
                )
            if self._counters[peer] < self._round:
                raise RuntimeError(
                    f"rank {self.rank}: all-reduce out of step: rank {peer} posted but its "
                    f"counter is {int(self._counters[peer])}, expected {self._round}"
                )
        np.add(slots[0][:count], slots[1][:count], out=dst)
        for slot in slots[2:]:
            np.add(dst, slot[:count], out=dst)

    # --- batch broadcast (rank 0 -> others) ---

    def next_input(self) -> memoryview:
        """Rank 0: the buffer to write the next batch's request bytes into."""
        return self._inputs[(self._batch + 1) & 1]

    def publish_input(self) -> None:
        """Rank 0: the bytes in next_input() are complete; wake the other ranks."""
        self._batch += 1
        for sem in self._bcast[1:]:
            sem.post()

    def wait_input(self, keep_waiting: Callable[[], bool], check_every: float = 1.0) -> memoryview | None:
        """Ranks > 0: block until rank 0 publishes a batch; None once keep_waiting() says stop."""
        sem = self._bcast[self.rank]
        while not sem.acquire(time.monotonic() + check_every, spin=1000):
            if not keep_waiting():
                return None
        self._batch += 1
        return self._inputs[self._batch & 1]

    def close(self) -> None:
        for view in self._inputs or ():
            view.release()
        self._counters = self._slots = self._inputs = None  # drop views so the map can close
        self.segment.close()
