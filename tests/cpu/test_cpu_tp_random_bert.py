"""Tensor parallelism on random small BERTs: G=2 and G=4 (ranks sharing the 2 cores),
uneven MLP slices, CLS pooling, an XLM-R (RoBERTa positions), and the refusals."""

from __future__ import annotations

import os

import pytest
from cpu_helpers import assert_close, own_segments, reference_embeddings, token_batch, write_random_bert

from queue_manager.protocol import InstanceFailed
from windve.cpu.bert_shapes import TensorParallelError
from windve.engine_process.instance import EngineProcessInstance
from windve.engines.torch_engine import TorchEngine
from windve.model import load_model_spec


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("random-bert")
    mean = write_random_bert(root / "mean", heads=4)  # MLP 90 wide: uneven slices for G=4
    cls = write_random_bert(root / "cls", heads=8, activation="gelu_new", pooling="cls")
    odd = write_random_bert(root / "odd", heads=6, hidden=48)
    xlmr = write_random_bert(root / "xlmr", heads=4, xlm_roberta=True)
    folders = {"mean": mean, "cls": cls, "odd": odd, "xlmr": xlmr}
    return {name: load_model_spec(str(path)) for name, path in folders.items()}


@pytest.mark.parametrize(
    ("model", "rank_cores"),
    [("mean", [[0], [1]]), ("mean", [[0], [1], [0], [1]]), ("cls", [[1], [0]]), ("xlmr", [[0], [1]])],
)
def test_tp_matches_the_unsharded_model(models, run_async, model, rank_cores):
    spec = models[model]
    assert spec.pooling == ("cls" if model == "cls" else "mean")
    instance = EngineProcessInstance(
        spec, name=f"rand-{model}", rank_cores=rank_cores, numa_nodes=[0] * len(rank_cores)
    )
    run_async(instance.start())
    try:
        assert [os.sched_getaffinity(pid) for pid in instance.pids] == [set(cores) for cores in rank_cores]
        sequences = token_batch(7, 120, seed=len(rank_cores))
        assert_close(run_async(instance.embed(sequences)), reference_embeddings(TorchEngine(spec), sequences))
    finally:
        run_async(instance.close())


def test_single_onnx_worker_matches_the_torch_reference(models, run_async, tmp_path):
    spec = models["mean"]
    instance = EngineProcessInstance(
        spec,
        name="onnx",
        rank_cores=[[1]],
        numa_nodes=[0],
        engine="onnx",
        dtype="auto",
        onnx_cache_dir=tmp_path,
    )
    run_async(instance.start())
    try:
        assert instance.info()["dtype"] == "fp32" and os.sched_getaffinity(instance.pids[0]) == {1}
        sequences = token_batch(5, 120, seed=11)
        assert_close(run_async(instance.embed(sequences)), reference_embeddings(TorchEngine(spec), sequences))
    finally:
        run_async(instance.close())


def test_a_degree_that_does_not_divide_the_heads_is_refused_naming_both(models):
    with pytest.raises(TensorParallelError, match=r"degree 4 does not divide the model's 6 attention heads"):
        EngineProcessInstance(models["odd"], name="odd", rank_cores=[[0], [1], [0], [1]], numa_nodes=[0] * 4)


def test_tp_needs_the_torch_engine(models):
    with pytest.raises(ValueError, match="torch engine only"):
        EngineProcessInstance(models["mean"], name="x", rank_cores=[[0], [1]], numa_nodes=[0, 0], engine="onnx")


def test_plan_shape_mismatches_are_refused(models):
    with pytest.raises(ValueError, match="2 ranks but 1 NUMA nodes"):
        EngineProcessInstance(models["mean"], name="x", rank_cores=[[0], [1]], numa_nodes=[0])
    with pytest.raises(ValueError, match="at least one core"):
        EngineProcessInstance(models["mean"], name="x", rank_cores=[[0], []], numa_nodes=[0, 0])


def test_a_rank_that_cannot_start_fails_start_and_leaves_nothing(tmp_path, run_async):
    folder = write_random_bert(tmp_path / "broken", heads=4)
    spec = load_model_spec(str(folder))
    (folder / "model.safetensors").unlink()  # the ranks will find no weights
    instance = EngineProcessInstance(
        spec, name="broken", rank_cores=[[0], [1]], numa_nodes=[0, 0], start_timeout=60
    )
    with pytest.raises(InstanceFailed, match=r"rank \d failed to start: KeyError: .*not found"):
        run_async(instance.start())
    assert instance.pids == [] and own_segments() == []
    run_async(instance.close())


def test_xlm_roberta_positions_start_after_the_padding_index(models, run_async):
    """64 position embeddings, counted from padding_idx + 1 = 2: 62 tokens fit, 63 are refused."""
    spec = models["xlmr"]
    assert spec.max_seq_length == 62
    instance = EngineProcessInstance(spec, name="xlmr-long", rank_cores=[[0], [1]], numa_nodes=[0, 0])
    run_async(instance.start())
    try:
        longest = token_batch(2, 120, lengths=[62, 5], seed=3)
        assert_close(run_async(instance.embed(longest)), reference_embeddings(TorchEngine(spec), longest))
        with pytest.raises(InstanceFailed, match="63 tokens exceeds the model's 62 positions"):
            run_async(instance.embed(token_batch(1, 120, lengths=[63], seed=4)))
        assert_close(run_async(instance.embed(longest)), reference_embeddings(TorchEngine(spec), longest))
    finally:
        run_async(instance.close())
