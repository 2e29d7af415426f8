"""A fixed-size record in shared memory that one process writes and others read whole (a seqlock).

`struct.pack_into` is no single store: CPython zeroes the target bytes, then packs each field. A
reader in another process sees what is there at that moment. Measured here, in 10 s of a writer
and a reader on two cores: an 8-byte CLOCK_MONOTONIC stamp read as 0.0 3,207 times in 18.6 M
reads, and the dispatcher's 32-byte state board looked 29,128 s stale. Such a read once got a
healthy engine restarted ("no heartbeat for 18386.5 s") and made a front end answer 503 "the
dispatcher is not answering" to the warm-up probe.

So a write is framed by a sequence number: odd while the fields change, even once they are whole.
A reader takes the number, the fields, and the number again, and keeps the fields only when both
numbers are the same even, non-zero value (zero: a number itself caught mid-write); otherwise it
reads again. Each number is written with one 8-byte copy, not `pack_into`, so it is never zeroed
on the way. x86-64 keeps stores in order as other cores see them; on weaker memory models the
interpreter's own locking between these statements orders them in practice.
"""

from __future__ import annotations

import struct

_SEQUENCE = struct.Struct("<Q")
READ_TRIES = 1000  # a write takes microseconds; a reader that fails this often has a dead writer


class TornRead(RuntimeError):
    """No whole record after READ_TRIES reads: its writer stopped in the middle of a write."""


class SharedRecord:
    """`layout`'s fields at the start of `buffer` (an mmap), behind their sequence number."""

    def __init__(self, buffer, layout: struct.Struct) -> None:
        self._buffer = buffer
        self._layout = layout

    @staticmethod
    def size(layout: struct.Struct) -> int:
        """Bytes the record takes in its buffer."""
        return _SEQUENCE.size + layout.size

    def write(self, *values) -> None:
        """Only one process (one thread) writes a record."""
        sequence = self._sequence()
        changing = sequence + 1 if sequence % 2 == 0 else sequence + 2  # odd, also after a writer died mid-write
        fields = self._layout.pack(*values)
        self._buffer[0:8] = _SEQUENCE.pack(changing)
        self._buffer[8 : 8 + len(fields)] = fields
        self._buffer[0:8] = _SEQUENCE.pack(changing + 1)

    def read(self) -> tuple:
        for _ in range(READ_TRIES):
            before = self._sequence()
            if before and before % 2 == 0:
                values = self._layout.unpack_from(self._buffer, 8)
                if self._sequence() == before:
                    return values
        raise TornRead(f"no whole record in {READ_TRIES} reads")

    def _sequence(self) -> int:
        return _SEQUENCE.unpack_from(self._buffer, 0)[0]
