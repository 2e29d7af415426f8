"""Where everything lives in a TP group's shared-memory segment (stdlib only: workers
unpickle it before they pin themselves and import numpy)."""

from __future__ import annotations

from dataclasses import dataclass

CELL = 128  # one control word per cell: no two ranks write one cache line (128: some ARM parts)
PAGE = 4096


def _align(value: int, to: int = PAGE) -> int:
    return (value + to - 1) // to * to


@dataclass(frozen=True)
class GroupLayout:
    """counters | pair sems | bcast sems | 2 input buffers | 2 x world float32 slots."""

    world: int
    reduce_elems: int  # float32 capacity of one slot; larger reduces run in chunks
    input_bytes: int  # capacity of one input buffer (one request message)

    @property
    def sems_offset(self) -> int:
        return self.world * CELL

    @property
    def bcast_offset(self) -> int:
        return self.sems_offset + self.world * self.world * CELL

    @property
    def input_offset(self) -> int:
        return _align(self.bcast_offset + self.world * CELL)

    @property
    def input_stride(self) -> int:
        return _align(self.input_bytes)

    @property
    def slot_offset(self) -> int:
        return self.input_offset + 2 * self.input_stride

    @property
    def slot_stride(self) -> int:
        return _align(self.reduce_elems * 4)

    @property
    def size(self) -> int:
        return self.slot_offset + 2 * self.world * self.slot_stride
