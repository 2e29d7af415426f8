"""libnuma binding (in a child, so the test process keeps its policy) and the wire format."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from windve.engine_process import wire
from windve.engines import pad_batch


def bind_in_child(node: int) -> str:
    code = f"from windve.cpu.numa import bind_memory; print(bind_memory({node}))"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_binding_to_an_existing_node_is_strict_or_says_why_not():
    status = bind_in_child(0)
    assert status == "bound" or status.startswith(("preferred", "unavailable: ")), status


def test_binding_to_a_missing_node_is_reported_not_raised():
    assert bind_in_child(99).startswith("unavailable: NUMA node 99 does not exist")


def test_request_round_trip_and_padding_match_pad_batch():
    rng = np.random.default_rng(3)
    sequences = [rng.integers(0, 30000, n).astype(np.int64) for n in (1, 7, 75, 3)]
    message = wire.encode_request(42, sequences)
    assert len(message) == wire.request_size(sequences)
    assert wire.message_kind(message) == (wire.EMBED, 42)
    lengths, ids = wire.decode_request(memoryview(message))
    input_ids, mask = wire.pad_ids(lengths, ids)
    expected_ids, expected_mask = pad_batch(sequences)
    np.testing.assert_array_equal(input_ids, expected_ids)
    np.testing.assert_array_equal(mask, expected_mask)
    assert input_ids.dtype == mask.dtype == np.int64


def test_result_is_a_writable_float32_copy():
    embeddings = np.arange(12, dtype=np.float32).reshape(3, 4)
    decoded = wire.decode_result(wire.encode_result(7, embeddings))
    np.testing.assert_array_equal(decoded, embeddings)
    decoded /= 2  # callers normalise in place
    assert wire.message_kind(wire.encode_result(7, embeddings)) == (wire.RESULT, 7)


def test_empty_sequence_is_refused():
    with pytest.raises(ValueError, match="empty"):
        wire.encode_request(1, [np.array([5]), np.array([], dtype=np.int32)])
