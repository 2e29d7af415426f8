"""The compact binary messages between an instance and its worker ranks (no pickling).

Every message is one `send_bytes` buffer: a 24-byte header (kind, count, dim, extra,
request id) and a body. EMBED carries int32 lengths then the int32 ids of all sequences
back to back; RESULT carries float32 [count, dim] (and in `extra` the worker's compute
time in microseconds); READY and ERROR carry UTF-8 JSON.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

import numpy as np

HEADER = struct.Struct("<IIIIQ")
# What a message arrives in: bytes from recv_bytes, or a view on a reused receive buffer.
Buffer = bytes | bytearray | memoryview
EMBED, STOP, RESULT, ERROR, READY = 1, 2, 3, 4, 5


def request_size(sequences: Sequence[np.ndarray]) -> int:
    return HEADER.size + 4 * len(sequences) + 4 * sum(len(seq) for seq in sequences)


def encode_request(request_id: int, sequences: Sequence[np.ndarray]) -> bytes:
    lengths = np.fromiter((len(seq) for seq in sequences), dtype=np.int32, count=len(sequences))
    if lengths.size and lengths.min() < 1:
        raise ValueError("cannot embed an empty token sequence")
    ids = np.concatenate(sequences).astype(np.int32, copy=False) if sequences else lengths[:0]
    return b"".join((HEADER.pack(EMBED, len(sequences), 0, 0, request_id), lengths.tobytes(), ids.tobytes()))


def encode_stop() -> bytes:
    return HEADER.pack(STOP, 0, 0, 0, 0)


def message_kind(buffer: Buffer) -> tuple[int, int]:
    """(kind, request id) of any message."""
    kind, _, _, _, request_id = HEADER.unpack_from(buffer)
    return kind, request_id


def decode_request(buffer: Buffer) -> tuple[np.ndarray, np.ndarray]:
    """EMBED body -> (lengths, ids), views on `buffer` (no copy)."""
    _, count, _, _, _ = HEADER.unpack_from(buffer)
    lengths = np.frombuffer(buffer, np.int32, count, HEADER.size)
    total = int(lengths.sum())
    ids = np.frombuffer(buffer, np.int32, total, HEADER.size + 4 * count)
    return lengths, ids


def pad_ids(lengths: np.ndarray, ids: np.ndarray, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded int64 (input_ids, attention_mask) [B, L], as engines.pad_batch makes them."""
    longest = int(lengths.max())
    mask = np.arange(longest)[None, :] < lengths[:, None]
    input_ids = np.full(mask.shape, pad_id, dtype=np.int64)
    input_ids[mask] = ids  # row-major order of the mask = the order the ids were concatenated
    return input_ids, mask.astype(np.int64)


def encode_result(request_id: int, embeddings: np.ndarray, compute_seconds: float = 0.0) -> bytes:
    count, dim = embeddings.shape
    body = np.ascontiguousarray(embeddings, dtype=np.float32).tobytes()
    micros = min(int(compute_seconds * 1e6), 0xFFFFFFFF)
    return HEADER.pack(RESULT, count, dim, micros, request_id) + body


def result_compute_seconds(buffer: Buffer) -> float:
    return HEADER.unpack_from(buffer)[3] / 1e6


def decode_result(buffer: Buffer) -> np.ndarray:
    """RESULT -> a writable float32 [count, dim] array."""
    _, count, dim, _, _ = HEADER.unpack_from(buffer)
    return np.frombuffer(buffer, np.float32, count * dim, HEADER.size).reshape(count, dim).copy()


def encode_json(kind: int, request_id: int, payload: dict) -> bytes:
    return HEADER.pack(kind, 0, 0, 0, request_id) + json.dumps(payload).encode()


def decode_json(buffer: Buffer) -> dict:
    return json.loads(bytes(buffer[HEADER.size :]).decode())
