"""The workload's pieces without a server: exact-length texts, API shapes, step verdicts."""

from __future__ import annotations

import random

import orjson
import pytest

from loadtest.api_shapes import NotAnEmbedding, embedding_dimension, request_body
from loadtest.exact_texts import ExactLengthTexts, corpus_sentences, load_tokenizer, text_source
from loadtest.recorder import BUSY_SUFFIX, Recorder, percentile, summarize
from loadtest.report import judge
from loadtest.workload import Workload
from windve.model import bundled_model_path, load_model_spec
from windve.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def server_tokenizer() -> TextTokenizer:
    """The service's own tokenizer path: what decides a request's length in the server."""
    return TextTokenizer(load_model_spec())


@pytest.mark.parametrize("tokens", [3, 16, 75, 128, 256])
def test_texts_encode_to_exactly_the_asked_length_in_the_server(server_tokenizer: TextTokenizer, tokens: int) -> None:
    texts = text_source(None, tokens).sample_many(40, random.Random(tokens))
    lengths = {len(ids) for ids in server_tokenizer.encode(texts, truncate=False)}
    assert lengths == {tokens}


def test_texts_are_varied_natural_corpus_text() -> None:
    texts = text_source(None, 75).sample_many(300, random.Random(7))
    assert len(set(texts)) >= 295  # a server-side cache sees mostly distinct texts
    first_words = {sentence.split()[0] for sentence in corpus_sentences()}
    assert all(text.split()[0] in first_words for text in texts)  # each starts at a corpus sentence


def test_tokenizer_from_a_folder_or_a_tokenizer_file_counts_the_same() -> None:
    folder = bundled_model_path()
    rng_a, rng_b = random.Random(3), random.Random(3)
    sentences = corpus_sentences()
    from_folder = ExactLengthTexts(load_tokenizer(str(folder)), 50, sentences).sample_many(5, rng_a)
    from_file = ExactLengthTexts(load_tokenizer(str(folder / "tokenizer.json")), 50, sentences).sample_many(5, rng_b)
    assert from_folder == from_file


def test_too_short_a_length_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        ExactLengthTexts(load_tokenizer(None), 2, corpus_sentences())


@pytest.mark.parametrize(
    ("api", "body", "expected"),
    [
        ("tei", [[0.1, 0.2], [0.3, 0.4]], 2),
        ("openai", {"data": [{"index": 1, "embedding": [0.5, 0.6]}, {"index": 0, "embedding": [0.1, 0.2]}]}, 2),
    ],
)
def test_embedding_answers_are_accepted(api: str, body: object, expected: int) -> None:
    assert embedding_dimension(Workload(api=api), orjson.dumps(body), expected) == 2


@pytest.mark.parametrize(
    ("api", "body", "count", "message"),
    [
        ("tei", [[0.1, 0.2]], 2, "1 embeddings for 2 texts"),
        ("tei", [[0.1, 0.2], [0.3]], 2, "equal-length"),
        ("tei", [[]], 1, "non-empty"),
        ("tei", {"error": "x"}, 1, "TEI shape"),
        ("openai", [[0.1]], 1, "OpenAI shape"),
        ("openai", {"data": [{"index": 0, "embedding": ["a"]}]}, 1, "non-number"),
    ],
)
def test_answers_that_are_not_embeddings_are_refused(api: str, body: object, count: int, message: str) -> None:
    with pytest.raises(NotAnEmbedding, match=message):
        embedding_dimension(Workload(api=api), orjson.dumps(body), count)
    with pytest.raises(NotAnEmbedding, match="not JSON"):
        embedding_dimension(Workload(api=api), b"<html>", count)


def test_request_bodies_have_each_api_shape() -> None:
    assert request_body(Workload(api="tei"), ["a"]) == {"inputs": ["a"], "normalize": True, "truncate": False}
    assert request_body(Workload(api="openai", model="m"), ["a"]) == {"input": ["a"], "model": "m"}


def test_recorder_keeps_busy_and_errors_apart_and_percentiles_are_nearest_rank() -> None:
    recorder = Recorder()
    for ms in range(1, 101):  # 1..100 ms
        recorder.on_request(name="/embed", response_time=float(ms), context={"dimension": 384})
    recorder.on_request(name="/embed" + BUSY_SUFFIX, response_time=1.0)
    recorder.on_request(name="/embed", response_time=5.0, exception=RuntimeError("HTTP 500"))
    assert recorder.answered == 102
    summary = summarize(recorder.take(), seconds=2.0, slo_seconds=0.095, texts_per_request=3)
    assert recorder.answered == 0  # take() started a new window
    assert (summary.served, summary.busy, summary.errors, summary.requests) == (100, 1, 1, 102)
    assert (summary.p50_ms, summary.p90_ms, summary.p99_ms, summary.max_ms) == (50.0, 90.0, 99.0, 100.0)
    assert summary.slo_misses == 5  # 96..100 ms
    assert summary.texts_per_second == 150.0
    assert summary.busy_share == round(1 / 102, 4)
    assert summary.dimensions == [384]
    assert summary.error_samples == ["/embed: HTTP 500"]
    assert percentile([1.0], 0.99) == 1.0


def test_a_step_passes_only_when_served_within_slo_without_busy_or_errors() -> None:
    recorder = Recorder()
    for ms in (100.0, 200.0):
        recorder.on_request(name="/embed", response_time=ms)
    clean = summarize(recorder.take(), 1.0, 1.0, 1)
    assert judge(clean, 1.0, busy_disqualifies=True) == (True, "within SLO")
    assert judge(clean, 0.15, busy_disqualifies=True) == (False, "p99 0.200 s > SLO 0.15 s")
    recorder.on_request(name="/embed", response_time=100.0)
    recorder.on_request(name="/embed" + BUSY_SUFFIX, response_time=1.0)
    busy = summarize(recorder.take(), 1.0, 1.0, 1)
    assert judge(busy, 1.0, busy_disqualifies=True) == (False, "BUSY 50.0%")
    assert judge(busy, 1.0, busy_disqualifies=False) == (True, "within SLO")
    assert judge(summarize(recorder.take(), 1.0, 1.0, 1), 1.0, True) == (False, "no answer served in the step")


def test_api_key_is_sent_but_never_recorded() -> None:
    workload = Workload(api_key="secret")
    assert workload.headers() == {"Authorization": "Bearer secret"}
    assert "secret" not in repr(workload) and "secret" not in str(workload.public())
    assert Workload().headers() == {}
    assert Workload.from_options(workload.to_options()) == workload
