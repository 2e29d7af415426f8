"""The engine interface and the padding every engine shares."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class Engine(Protocol):
    """Embeds one padded batch: the model's sentence-transformers pipeline up to, not including,
    Normalize (windve.engines.head). The caller normalizes per request."""

    dim: int
    device: str

    def embed(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """int64 [B, L] ids and mask -> float32 [B, dim] embeddings (dim: after the Dense layers)."""
        ...

    def stage(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> Any:
        """The first half of `embed`: the batch made ready to `run` (on a GPU: copied to it).

        An engine process stages batch N+1 in a thread of its own while batch N runs."""
        ...

    def run(self, staged: Any) -> np.ndarray:
        """The second half of `embed`: `embed(ids, mask) == run(stage(ids, mask))`."""
        ...


def pad_batch(sequences: Sequence[np.ndarray], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token-id sequences to the longest one: (input_ids, attention_mask), int64."""
    longest = max(len(seq) for seq in sequences)
    input_ids = np.full((len(sequences), longest), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(sequences), longest), dtype=np.int64)
    for row, seq in enumerate(sequences):
        input_ids[row, : len(seq)] = seq
        attention_mask[row, : len(seq)] = 1
    return input_ids, attention_mask

