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
reads again, a hundred times at most, and then keeps the last whole record it read: a writer
descheduled in the middle of a write must not look like a dead one, and a dead one's stamp ages
either way. Only a reader that never read a whole record waits for one, up to a second. Each
number is written with one 8-byte copy, not `pack_into`, so it is never zeroed on the way.
x86-64 keeps stores in order as other cores see them; on weaker memory models the interpreter's
own locking between these statements orders them in practice.
"""

from __future__ import annotations

import mmap
import struct
import time

_SEQUENCE = struct.Struct("<Q")
FAST_TRIES = 100  # a write takes about a microsecond: a reader retrying this long met a slow writer
FIRST_READ_SECONDS = 1.0  # a reader with no whole record yet waits this long for one


class TornRead(RuntimeError):
    """No whole record yet, and none for FIRST_READ_SECONDS: its writer stopped in the middle of a write."""


class SharedRecord:
    """`layout`'s fields at the start of `buffer` (an mmap), behind their sequence number."""

    def __init__(self, buffer: mmap.mmap, layout: struct.Struct) -> None:
        self._buffer = buffer
        self._layout = layout
        self._last: tuple | None = None  # the last whole record this reader read

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
        """The record as last written whole. While a write is under way (a writer descheduled in the
        middle of one, on a busy host, for milliseconds), the last whole record this reader read:
        its fields are a moment old, and a stamp among them ages as a dead writer's would."""
        whole = self._whole(FAST_TRIES)
        if whole is None and self._last is None:
            deadline = time.monotonic() + FIRST_READ_SECONDS
            while whole is None and time.monotonic() < deadline:
                time.sleep(0.001)  # the writer needs a core to finish its write
                whole = self._whole(FAST_TRIES)
            if whole is None:
                raise TornRead(f"no whole record in {FIRST_READ_SECONDS:g} s")
        if whole is not None:
            self._last = whole
        return self._last

    def _whole(self, tries: int) -> tuple | None:
        for _ in range(tries):
            before = self._sequence()
            if before and before % 2 == 0:
                values = self._layout.unpack_from(self._buffer, 8)
                if self._sequence() == before:
                    return values
        return None

    def _sequence(self) -> int:
        return _SEQUENCE.unpack_from(self._buffer, 0)[0]
