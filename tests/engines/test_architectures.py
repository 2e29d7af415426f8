"""Encoders beyond BERT give sentence-transformers' vectors; a model_type not tested is refused in a line.

Each is a two-layer random-weight model with the bundled tokenizer (speed and shapes do not matter
here, only that the same ids reach the same weights as in sentence-transformers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from windve.engines import create_engine, pad_batch
from windve.model import ENCODER_TYPES, ModelError, load_model_spec
from windve.tokenizer import TextTokenizer

TEXTS = ["A", "The quick brown fox jumps over the lazy dog.", "Embeddings turn text into vectors.", "ok  ok "]
SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
# Per model_type, what its config calls the sizes above, and the ids it must share with the tokenizer.
SHAPES = {
    "mpnet": SMALL,  # all-mpnet-base-v2: its class had no sdpa
    "distilbert": {"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128},
    "electra": SMALL | {"embedding_size": 32},
    "deberta-v2": SMALL,
    "modernbert": SMALL | {"global_attn_every_n_layers": 1, "bos_token_id": 101, "eos_token_id": 102,
                           "cls_token_id": 101, "sep_token_id": 102},  # fmt: skip
    "albert": SMALL | {"embedding_size": 32},
}


def build(folder: Path, model_type: str) -> Path:
    from transformers import AutoConfig, AutoModel

    bundled = load_model_spec().path
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(bundled / name, folder / name)
    config = AutoConfig.for_model(model_type, vocab_size=30522, pad_token_id=0, **SHAPES[model_type])
    torch.manual_seed(3)
    AutoModel.from_config(config).save_pretrained(str(folder))  # safetensors
    hidden = SHAPES[model_type].get("hidden_size") or SHAPES[model_type]["dim"]
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": True})
    )
    (folder / "2_Normalize").mkdir()
    modules = [("sentence_transformers.models.Transformer", ""), ("sentence_transformers.models.Pooling", "1_Pooling"),
               ("sentence_transformers.models.Normalize", "2_Normalize")]  # fmt: skip
    (folder / "modules.json").write_text(
        json.dumps([{"idx": i, "name": str(i), "path": path, "type": kind} for i, (kind, path) in enumerate(modules)])
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    return folder


@pytest.mark.parametrize("engine_name", ["torch", "onnx"])
@pytest.mark.parametrize("model_type", sorted(SHAPES))
def test_an_encoder_of_each_type_gives_sentence_transformers_vectors(model_type: str, engine_name, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = build(tmp_path / model_type, model_type)
    spec = load_model_spec(str(folder))
    engine = create_engine(spec, engine_name, "cpu", "fp32", tmp_path / "onnx")
    vectors = engine.embed(*pad_batch(TextTokenizer(spec).encode(TEXTS, truncate=True)))
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert spec.normalize  # the service normalizes what the engine pools, as the model's Normalize does
    np.testing.assert_allclose(vectors / np.linalg.norm(vectors, axis=1, keepdims=True), expected, atol=1e-5)


def test_mpnet_positions_start_after_padding_as_roberta_does(tmp_path: Path) -> None:
    """Its positions are numbered from padding_idx + 1: 514 of them hold 512 tokens, not 514."""
    folder = build(tmp_path / "mpnet", "mpnet")
    (folder / "sentence_bert_config.json").write_text("{}")
    config = json.loads((folder / "config.json").read_text())
    assert load_model_spec(str(folder)).max_seq_length == config["max_position_embeddings"] - 1  # pad 0: from 1


def test_a_model_type_not_tested_is_refused_in_one_line(tmp_path: Path) -> None:
    """T5 and decoder embedders had failed in every engine's start, after the front end said it was up."""
    folder = Path(shutil.copytree(load_model_spec().path, tmp_path / "t5"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": "t5"}))
    said = r"model_type 't5' is not served; WindVE serves the encoders bert, roberta"
    with pytest.raises(ModelError, match=said) as error:
        load_model_spec(str(folder))
    assert "\n" not in str(error.value) and set(SHAPES) <= set(ENCODER_TYPES)
