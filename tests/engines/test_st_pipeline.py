"""Models as sentence-transformers 6.2 saves them (and 3.x-style Pooling configs): every engine
applies the same pooling and Dense head and gives sentence-transformers' vectors."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from textwrap import indent

import numpy as np
import pytest
import torch

from windve.engines import create_engine, pad_batch
from windve.model import DENSE_ACTIVATIONS, POOLING_MODES, ModelError, load_model_spec
from windve.tokenizer import TextTokenizer

# Varied lengths, so that padding shows in every pooling mode.
TEXTS = ["A", "The quick brown fox jumps over the lazy dog.", "Embeddings turn text into vectors.", "ok ok"]


@pytest.fixture(scope="module")
def minilm():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(load_model_spec().path), device="cpu")


def save_st(folder: Path, minilm, *head) -> Path:
    """The bundled MiniLM's Transformer + `head` modules, saved by sentence-transformers itself."""
    from sentence_transformers import SentenceTransformer

    SentenceTransformer(modules=[minilm[0], *head], device="cpu").save(str(folder))
    return folder


def dense_head(seed: int = 7):
    from sentence_transformers.base.modules import Dense
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(seed)
    return Pooling(384, pooling_mode="mean"), Dense(384, 128, activation_function=torch.nn.Tanh())


@pytest.fixture(scope="module")
def dense_model(minilm, tmp_path_factory) -> Path:
    return save_st(tmp_path_factory.mktemp("st") / "dense", minilm, *dense_head())


def copy(folder: Path, target: Path) -> Path:
    return Path(shutil.copytree(folder, target))


def reference(folder: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_numpy=True)


def embed(engine, spec) -> np.ndarray:
    return engine.embed(*pad_batch(TextTokenizer(spec).encode(TEXTS, truncate=True)))


def assert_matches(vectors: np.ndarray, expected: np.ndarray) -> None:
    assert vectors.dtype == np.float32 and vectors.shape == expected.shape
    cosine = (vectors * expected).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.999, cosine
    # Lengths too: mean and mean_sqrt_len_tokens differ only by a scale that cosine cannot see.
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), np.linalg.norm(expected, axis=1), rtol=1e-3)


def test_a_dense_head_is_read_and_survives_the_trip_to_a_worker(dense_model, minilm):
    from windve.engine_process.worker import RankPlan

    spec = load_model_spec(str(dense_model))
    assert (spec.pooling, spec.dim, spec.normalize, spec.matryoshka_dims) == ("mean", 128, False, ())
    (layer,) = spec.dense
    assert (layer.path, layer.in_features, layer.out_features, layer.activation) == ("2_Dense", 384, 128, "Tanh")
    assert spec.max_seq_length == minilm.max_seq_length  # 6.x keeps it in tokenizer_config.json
    plan = RankPlan(spec=spec, instance="x", rank=0, world=1, cores=(0,), numa_node=0, engine="torch", dtype="fp32")
    assert RankPlan.from_json(plan.to_json()).spec == spec


def test_the_revision_follows_the_dense_weights(dense_model, minilm, tmp_path):
    retrained = save_st(tmp_path / "retrained", minilm, *dense_head(seed=8))
    assert load_model_spec(str(retrained)).revision != load_model_spec(str(dense_model)).revision


@pytest.mark.parametrize("engine", ["torch", "onnx"])
def test_engines_apply_the_dense_head(dense_model, engine, tmp_path):
    spec = load_model_spec(str(dense_model))
    vectors = embed(create_engine(spec, engine, "cpu", "fp32", tmp_path), spec)
    assert_matches(vectors, reference(dense_model))


def test_the_tensor_parallel_core_applies_the_dense_head(dense_model):
    from windve.engine_process.instance import EngineProcessInstance

    spec = load_model_spec(str(dense_model))
    instance = EngineProcessInstance(spec, name="st-dense", rank_cores=[[0], [1]], numa_nodes=[0, 0])
    with asyncio.Runner() as runner:
        runner.run(instance.start())
        try:
            vectors = runner.run(instance.embed(TextTokenizer(spec).encode(TEXTS, truncate=True)))
        finally:
            runner.run(instance.close())
    assert_matches(vectors, reference(dense_model))


@pytest.mark.parametrize("mode", [*POOLING_MODES, ("cls", "max")])
def test_every_pooling_mode_matches_sentence_transformers(minilm, tmp_path, mode):
    from sentence_transformers.sentence_transformer.modules import Pooling

    folder = save_st(tmp_path / "pooled", minilm, Pooling(384, pooling_mode=mode))
    spec = load_model_spec(str(folder))
    assert spec.pooling == (mode if isinstance(mode, str) else "+".join(mode))
    assert_matches(embed(create_engine(spec, "torch", "cpu", "fp32"), spec), reference(folder))


def test_stacked_dense_layers_with_a_residual_then_normalize(minilm, tmp_path):
    from sentence_transformers.base.modules import Dense, Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(3)
    residual = Dense(384, 256, activation_function=torch.nn.GELU(), use_residual=True)
    plain = Dense(256, 64, activation_function=None)
    folder = save_st(tmp_path / "stacked", minilm, Pooling(384), residual, plain, Normalize())
    spec = load_model_spec(str(folder))
    assert [(layer.activation, layer.residual) for layer in spec.dense] == [("GELU", True), ("Identity", False)]
    assert (spec.dim, spec.normalize) == (64, True)
    vectors = embed(create_engine(spec, "torch", "cpu", "fp32"), spec)
    # The engines stop before Normalize; the front end normalizes, as here.
    assert_matches(vectors / np.linalg.norm(vectors, axis=1, keepdims=True), reference(folder))


def test_a_3x_style_pooling_config_is_read_as_sentence_transformers_reads_it(minilm, tmp_path):
    from sentence_transformers.sentence_transformer.modules import Pooling

    folder = save_st(tmp_path / "legacy", minilm, Pooling(384))
    legacy = {"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}
    legacy |= {"pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(legacy))
    spec = load_model_spec(str(folder))
    assert (spec.pooling, spec.dim) == ("cls+mean", 768)
    assert_matches(embed(create_engine(spec, "torch", "cpu", "fp32"), spec), reference(folder))


def test_any_other_module_stops_the_start_naming_it(dense_model, tmp_path):
    folder = copy(dense_model, tmp_path / "other")
    modules = json.loads((folder / "modules.json").read_text())
    layer_norm = {"idx": 3, "name": "3", "path": "", "type": "sentence_transformers.models.LayerNorm"}
    (folder / "modules.json").write_text(json.dumps([*modules, layer_norm]))
    with pytest.raises(ModelError, match=r"'3' of type 'sentence_transformers.models.LayerNorm' is not supported"):
        load_model_spec(str(folder))
    (folder / "modules.json").write_text(json.dumps([modules[0], modules[2], modules[1]]))
    with pytest.raises(ModelError, match="Transformer -> Dense -> Pooling are not supported"):
        load_model_spec(str(folder))


def test_a_dense_layer_without_safetensors_is_refused(dense_model, tmp_path):
    folder = copy(dense_model, tmp_path / "pickled")
    (folder / "2_Dense" / "model.safetensors").rename(folder / "2_Dense" / "pytorch_model.bin")
    with pytest.raises(ModelError, match="Dense 2_Dense has no model.safetensors .only pickled weights"):
        load_model_spec(str(folder))


def test_dense_activations_are_known_by_name(dense_model, tmp_path):
    from windve.engines.head import ACTIVATIONS

    assert set(ACTIVATIONS) == set(DENSE_ACTIVATIONS)
    folder = copy(dense_model, tmp_path / "activation")
    config_file = folder / "2_Dense" / "config.json"
    for unknown in ("torch.nn.modules.activation.Hardswish", "my_package.CustomActivation"):
        config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"activation_function": unknown}))
        with pytest.raises(ModelError, match=f"activation '{unknown}' is not supported"):
            load_model_spec(str(folder))


def test_matryoshka_dims_from_the_model_card_or_the_operator(dense_model, minilm, tmp_path):
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss, MultipleNegativesRankingLoss

    folder = copy(dense_model, tmp_path / "matryoshka")
    loss = MatryoshkaLoss(minilm, MultipleNegativesRankingLoss(minilm), matryoshka_dims=[128, 64, 32])
    # As sentence-transformers' model card renders a training loss's parameters.
    parameters = indent(f"```json\n{json.dumps(loss.get_config_dict(), indent=4)}\n```", "  ")
    (folder / "README.md").write_text(f"* Loss: MatryoshkaLoss with these parameters:\n{parameters}\n")
    assert load_model_spec(str(folder)).matryoshka_dims == (128, 64, 32)
    assert load_model_spec(str(folder), matryoshka_dims=[32, 96]).matryoshka_dims == (96, 32)
    assert load_model_spec(str(folder), matryoshka_dims=[]).matryoshka_dims == ()
    for wrong in ([0], [129], [64, 12.5]):
        with pytest.raises(ModelError, match="between 1 and the output dimension 128"):
            load_model_spec(str(folder), matryoshka_dims=wrong)


def unit(vectors: np.ndarray) -> np.ndarray:
    """What the front end answers for a model that ends with Normalize (engines leave it to it)."""
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def cased(folder: Path) -> Path:
    """The folder's WordPiece tokenizer made case-sensitive: "What" is no longer "what"."""
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"] = False
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def test_do_lower_case_lowercases_before_a_cased_tokenizer(minilm, tmp_path):
    """sentence_bert_config.json's do_lower_case had been ignored: over a cased vocabulary every
    text with a capital letter got another vector than sentence-transformers gives."""
    folder = cased(copy(load_model_spec().path, tmp_path / "lower"))
    config = json.loads((folder / "sentence_bert_config.json").read_text())
    (folder / "sentence_bert_config.json").write_text(json.dumps(config | {"do_lower_case": True}))
    spec = load_model_spec(str(folder))
    assert spec.lower_case
    tokenizer = TextTokenizer(spec)
    assert [ids.tolist() for ids in tokenizer.encode(["What is WindVE?"], True)] == [
        ids.tolist() for ids in tokenizer.encode(["what is windve?"], True)
    ]
    assert_matches(unit(embed(create_engine(spec, "torch", "cpu", "fp32"), spec)), reference(folder))
    unlowered = load_model_spec(str(cased(copy(load_model_spec().path, tmp_path / "cased"))))
    assert not unlowered.lower_case
    (kept,), (lowered,) = TextTokenizer(unlowered).encode(["WindVE"], True), tokenizer.encode(["WindVE"], True)
    assert kept.tolist() != lowered.tolist()


def test_a_left_truncating_tokenizer_keeps_a_long_texts_end(tmp_path):
    """tokenizer_config.json's truncation_side "left" had been ignored: texts over the limit kept
    their start, where sentence-transformers keeps their end."""
    folder = copy(load_model_spec().path, tmp_path / "left")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"truncation_side": "left"}))
    sentence = json.loads((folder / "sentence_bert_config.json").read_text())
    (folder / "sentence_bert_config.json").write_text(json.dumps(sentence | {"max_seq_length": 8}))
    spec = load_model_spec(str(folder))
    assert (spec.truncation_side, spec.max_seq_length) == ("left", 8)
    (ids,) = TextTokenizer(spec).encode(["one two three four five six seven eight nine ten"], True)
    (end,) = TextTokenizer(spec).encode(["five six seven eight nine ten"], True)
    assert ids.tolist() == end.tolist()  # [CLS] ... [SEP] around the last six words
    assert_matches(unit(embed(create_engine(spec, "torch", "cpu", "fp32"), spec)), reference(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"truncation_side": "middle"}))
    with pytest.raises(ModelError, match="truncation_side 'middle'"):
        load_model_spec(str(folder))
