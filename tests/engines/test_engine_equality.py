"""Every engine must give sentence-transformers' embeddings for the same texts."""

from __future__ import annotations

import numpy as np
import pytest

from windve.engines import create_engine, pad_batch
from windve.tokenizer import TextTokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Embedding services turn text into vectors for retrieval.",
    "A",
    "Where is the nearest train station? I need to get to the airport before noon.",
    "Les modèles multilingues gèrent aussi les accents et la ponctuation « française ».",
    "1234 5678 ##$$ @@ !!",
    " ".join(["long input that the tokenizer has to cut at the model limit"] * 40),
]

MIN_COSINE = {"fp32": 0.99999, "bf16": 0.999}


@pytest.fixture(scope="module")
def reference(reference_model) -> np.ndarray:
    return reference_model.encode(TEXTS, normalize_embeddings=False, convert_to_numpy=True)


@pytest.fixture(scope="module")
def batch(model_spec):
    sequences = TextTokenizer(model_spec).encode(TEXTS, truncate=True)
    return pad_batch(sequences)


@pytest.mark.parametrize(("engine", "dtype"), [("torch", "fp32"), ("torch", "bf16"), ("onnx", "fp32")])
def test_engine_matches_sentence_transformers(model_spec, reference, batch, tmp_path_factory, engine, dtype):
    instance = create_engine(model_spec, engine, "cpu", dtype, tmp_path_factory.mktemp("onnx"))
    vectors = instance.embed(*batch)
    assert vectors.dtype == np.float32 and vectors.shape == reference.shape
    cosine = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= MIN_COSINE[dtype], cosine


def test_onnx_export_is_cached(model_spec, tmp_path):
    first = create_engine(model_spec, "onnx", "cpu", "fp32", tmp_path)
    exported = first.model_file
    stamp = exported.stat().st_mtime_ns
    second = create_engine(model_spec, "onnx", "cpu", "fp32", tmp_path)
    assert second.model_file == exported and exported.stat().st_mtime_ns == stamp
    assert model_spec.revision in exported.name
    fused_ops = {node.op_type for node in __import__("onnx").load(str(exported)).graph.node}
    assert "Attention" in fused_ops or "MultiHeadAttention" in fused_ops, fused_ops


def test_onnx_providers_follow_the_device():
    from windve.engines.onnx_engine import OnnxEngineError, execution_providers

    assert execution_providers("cpu", ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    cuda = execution_providers("cuda:1", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert cuda[0] == ("CUDAExecutionProvider", {"device_id": 1})
    npu = execution_providers("npu:0", ["CANNExecutionProvider", "CPUExecutionProvider"])
    assert npu[0] == ("CANNExecutionProvider", {"device_id": 0})
    with pytest.raises(OnnxEngineError, match="CUDAExecutionProvider"):
        execution_providers("cuda:0", ["CPUExecutionProvider"])
    with pytest.raises(OnnxEngineError, match="unknown device"):
        execution_providers("tpu:0", ["CPUExecutionProvider"])


def test_dtype_auto_resolution():
    from windve.engines import resolve_dtype

    assert resolve_dtype("fp32", "cpu") == "fp32"
    assert resolve_dtype("auto", "cuda:0") == "fp16"
    assert resolve_dtype("auto", "npu:0") == "fp16"
    assert resolve_dtype("auto", "cpu") in {"bf16", "fp32"}


def test_dtype_auto_never_gives_the_onnx_engine_bf16(model_spec, monkeypatch):
    """On a CPU with bf16 units `engine: onnx` with the default dtype had stopped the start
    ("onnx engine supports fp32 and fp16, not bf16"): the instance was built with auto resolved
    for torch."""
    import windve.engines.factory as factory
    from devices import detect_hardware
    from windve.service import build_instance, make_plan
    from windve.settings import Settings

    monkeypatch.setattr(factory, "cpu_supports_bf16", lambda: True)
    assert factory.resolve_dtype("auto", "cpu") == "bf16"
    assert factory.resolve_dtype("auto", "cpu", "onnx") == "fp32"
    assert factory.resolve_dtype("auto", "cuda:0", "onnx") == "fp16"
    hardware = detect_hardware()
    for engine, dtype in (("onnx", "fp32"), ("torch", "bf16")):
        settings = Settings(engine=engine)
        plan = make_plan(settings, hardware)
        instance = build_instance(settings, model_spec, hardware, plan.pools[0].instances[0])
        assert instance.dtype == dtype


def test_pad_batch_masks_padding():
    ids, mask = pad_batch([np.array([101, 7, 102]), np.array([101, 102])])
    assert ids.tolist() == [[101, 7, 102], [101, 102, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]


def test_shape_buckets_pad_rows_and_tokens_to_the_step_and_mask_the_padding():
    from windve.engines.torch_engine import bucketed

    ids = np.arange(1, 5 * 13 + 1, dtype=np.int64).reshape(5, 13)
    mask = np.ones_like(ids)
    mask[2, 9:] = 0
    padded_ids, padded_mask = bucketed(ids, mask, 8)
    assert padded_ids.shape == padded_mask.shape == (8, 16)
    assert (padded_ids[:5, :13] == ids).all() and (padded_mask[:5, :13] == mask).all()
    assert not padded_mask[:5, 13:].any()
    # A padding row attends to one token: never a row with nothing to attend to.
    assert (padded_mask[5:].sum(1) == 1).all()
    same_ids, same_mask = bucketed(padded_ids, padded_mask, 8)
    assert same_ids is padded_ids and same_mask is padded_mask


def test_a_bucketed_batch_embeds_as_the_exact_one(model_spec):
    """What an accelerator engine does (rows and tokens padded to 8), on the CPU: same vectors."""
    batch = pad_batch(TextTokenizer(model_spec).encode(TEXTS[:4], truncate=True))  # 4 rows, 19 tokens
    assert batch[0].shape[0] % 8 and batch[0].shape[1] % 8  # the bucket really pads both ways
    instance = create_engine(model_spec, "torch", "cpu", "fp32")
    assert instance.shape_step == 1  # a CPU keeps exact shapes
    exact = instance.embed(*batch)
    instance.shape_step = 8
    padded = instance.embed(*batch)
    assert padded.shape == exact.shape
    np.testing.assert_allclose(padded, exact, rtol=0, atol=2e-5)
