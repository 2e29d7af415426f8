"""Helpers shared by the CPU core tests (a uniquely named module, not conftest: importable)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


def token_batch(count: int, vocab: int, lengths: list[int] | None = None, seed: int = 0) -> list[np.ndarray]:
    """`count` random id sequences of varied (or given) lengths, valid for `vocab`."""
    rng = np.random.default_rng(seed)
    lengths = lengths or [int(n) for n in rng.integers(3, 40, count)]
    low, high = (1000, min(vocab, 20000)) if vocab > 20000 else (3, vocab)
    return [rng.integers(low, high, n).astype(np.int32) for n in lengths]


def reference_embeddings(engine, sequences) -> np.ndarray:
    from windve.engines import pad_batch

    return engine.embed(*pad_batch(sequences))


def assert_close(actual: np.ndarray, expected: np.ndarray, atol: float = 1e-4) -> None:
    assert actual.shape == expected.shape and actual.dtype == np.float32
    assert np.abs(actual - expected).max() <= atol
    cosine = (actual * expected).sum(1) / np.linalg.norm(actual, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.99999


def write_random_bert(
    folder: Path,
    *,
    heads: int,
    hidden: int = 64,
    intermediate: int = 90,
    layers: int = 3,
    activation: str = "gelu",
    pooling: str = "mean",
    xlm_roberta: bool = False,
) -> Path:
    """A randomly initialised BertModel (or XLMRobertaModel: positions from padding_idx + 1) saved
    as a model folder (safetensors + config.json)."""
    import torch
    from transformers import BertConfig, BertModel, XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(heads * 1000 + hidden)
    config_class, model_class = (XLMRobertaConfig, XLMRobertaModel) if xlm_roberta else (BertConfig, BertModel)
    config = config_class(
        vocab_size=120,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        max_position_embeddings=64,
        hidden_act=activation,
        initializer_range=0.1,
        pad_token_id=1 if xlm_roberta else 0,
    )
    model_class(config, add_pooling_layer=False).eval().save_pretrained(folder, safe_serialization=True)
    if pooling == "cls":
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
        (folder / "modules.json").write_text(
            json.dumps(
                [
                    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                    {
                        "idx": 1,
                        "name": "1",
                        "path": "1_Pooling",
                        "type": "sentence_transformers.models.Pooling",
                    },
                ]
            )
        )
    return folder


def own_segments() -> list[Path]:
    """Shared-memory segments created by this (test) process that still have a name."""
    from windve.cpu.shm import SEGMENT_PREFIX, segment_files

    return [path for path in segment_files() if path.name.startswith(f"{SEGMENT_PREFIX}{os.getpid()}-")]
