"""What front ends and the dispatcher say to each other over their link: one msgpack frame a message.

An embed request carries its token ids and an answer its vectors inside that frame, as raw
int32 / float32 bytes (msgpack's bin type), never pickled. One frame rather than a header frame
and array frames: ZMQ, which carried the hop then, cost per frame. In bench/hop.py the front
end's CPU per request fell from 25.5-34.6 us to 20.5-23.5 and the dispatcher's from 40.6-48.6
to 37.1-38.6 (bench/SERVED.md, 2026-11-26). Packing copies the ids and the vectors once more: a
few hundred bytes and 1.5 KB for a one-text request. The metrics text still travels as a frame of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgpack
import numpy as np

from windve.engine_process.wire import Buffer

EMBED, CANCEL, INFO, METRICS = "embed", "cancel", "info", "metrics"
SERVING = "serving"  # a front end can answer /embed now (no answer): the warm-up probe waits for every one
# A front end's answered requests (no answer), each with its time from its bytes' arrival to the
# answer back in the front end: depth control's live samples (server.py `_reported`).
DONE = "done"
# Answer statuses, each mapped to an HTTP answer by the front end.
OK, BUSY, DRAINING, UNAVAILABLE, FAILED = "ok", "busy", "draining", "unavailable", "failed"


def pack(header: dict) -> bytes:
    return msgpack.packb(header)


def unpack(frame: Buffer) -> dict:
    return msgpack.unpackb(frame)


def pack_sequences(sequences: Sequence[np.ndarray]) -> tuple[bytes, bytes]:
    """Token-id sequences -> (int32 lengths, int32 ids back to back)."""
    lengths = np.fromiter((len(seq) for seq in sequences), dtype=np.int32, count=len(sequences))
    ids = np.concatenate(sequences).astype(np.int32, copy=False)
    return lengths.tobytes(), ids.tobytes()


def unpack_sequences(lengths_bytes: Buffer, ids_bytes: Buffer) -> list[np.ndarray]:
    """The inverse of pack_sequences: views on the received buffer, no copy.

    Sliced in Python: most requests carry one text or a few, where numpy's split and sums cost
    more than the slices (they were an eighth of the dispatcher's time, bench/hop.py)."""
    lengths = np.frombuffer(lengths_bytes, dtype=np.int32).tolist()
    ids = np.frombuffer(ids_bytes, dtype=np.int32)
    if not lengths or sum(lengths) != ids.size or min(lengths) < 1:
        raise ValueError("malformed embed message: lengths and ids disagree")
    if len(lengths) == 1:
        return [ids]
    sequences, start = [], 0
    for length in lengths:
        sequences.append(ids[start : start + length])
        start += length
    return sequences


def unpack_vectors(data: Buffer, count: int, dim: int) -> np.ndarray:
    """A writable float32 [count, dim] copy: the front end normalizes it in place."""
    return np.frombuffer(data, dtype=np.float32, count=count * dim).reshape(count, dim).copy()


def front_end_identity(pid: int) -> bytes:
    """A front end's identity: the dispatcher knows its front ends' messages by their pids."""
    return f"fe-{pid}".encode()
