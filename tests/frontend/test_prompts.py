"""sentence-transformers prompts: a model saved with `prompts` and a `default_prompt_name` gives, over
HTTP, the vectors sentence-transformers' own `encode` gives, with the default prompt or a named one.

The model is the bundled MiniLM saved again by sentence-transformers with prompts; the server is a
real `windve serve` (fp32, so the vectors match to float error); the clients are httpx and
huggingface_hub's InferenceClient, which sends `prompt_name` itself.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.servers import start_server
from windve.model import ModelError, load_model_spec
from windve.prompts import default_prompt
from windve.settings import Settings

PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = ["How do embeddings find passages?", "A passage about vectors."]


@pytest.fixture(scope="module")
def st_model(tmp_path_factory):
    """The bundled MiniLM, saved by sentence-transformers with PROMPTS and default_prompt_name "query"."""
    from sentence_transformers import SentenceTransformer

    bundled = SentenceTransformer(str(load_model_spec().path), device="cpu")
    model = SentenceTransformer(
        modules=list(bundled), device="cpu", prompts=PROMPTS, default_prompt_name="query"
    )
    folder = tmp_path_factory.mktemp("prompted") / "minilm-prompts"
    model.save(str(folder))
    return folder, model


@pytest.fixture(scope="module")
def server(st_model, tmp_path_factory):
    folder, _ = st_model
    started = start_server(
        tmp_path_factory.mktemp("prompt-server"), "--model", str(folder), "--dtype", "fp32", "--cpu-depth", "16"
    )
    yield started
    started.stop()


def embed(server, **body) -> np.ndarray:
    answer = httpx.post(server.url + "/embed", json={"inputs": TEXTS, **body}, timeout=60)
    assert answer.status_code == 200, answer.text
    return np.array(answer.json())


def test_the_models_default_prompt_is_applied_as_sentence_transformers_does(server, st_model):
    _, model = st_model
    np.testing.assert_allclose(embed(server), model.encode(TEXTS), atol=2e-5)  # encode applies "query: "
    assert not np.allclose(embed(server), model.encode(TEXTS, prompt=""), atol=1e-3)
    info = httpx.get(server.url + "/info").json()["model"]
    assert info["prompts"] == PROMPTS | {"document": ""} and info["default_prompt"] == "query: "


def test_a_named_prompt_replaces_the_default(server, st_model):
    _, model = st_model
    np.testing.assert_allclose(embed(server, prompt_name="passage"), model.encode(TEXTS, prompt_name="passage"),
                               atol=2e-5)
    # sentence-transformers 6 saves an empty "document" prompt beside the ones it was given.
    np.testing.assert_allclose(embed(server, prompt_name="document"), model.encode(TEXTS, prompt=""), atol=2e-5)


def test_the_openai_route_uses_the_default_prompt(server):
    answer = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS, "model": "m"}, timeout=60).json()
    np.testing.assert_allclose([item["embedding"] for item in answer["data"]], embed(server), atol=1e-6)
    tokens_without_prompt = httpx.post(server.url + "/tokenize", json={"inputs": TEXTS, "prompt_name": "document"})
    prompt_tokens = sum(len(tokens) for tokens in tokens_without_prompt.json()) + 2 * len(TEXTS)  # "query", ":"
    assert answer["usage"]["prompt_tokens"] == prompt_tokens


def test_huggingface_hubs_client_sends_its_prompt_name(server, monkeypatch):
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # a local URL: no hub call is made
    vector = InferenceClient(model=server.url).feature_extraction(TEXTS[0], prompt_name="passage")
    np.testing.assert_allclose(vector[0], embed(server, prompt_name="passage")[0], atol=1e-6)


def test_tokenize_puts_the_prompt_in_front(server):
    [tokens] = httpx.post(server.url + "/tokenize", json={"inputs": "hello", "prompt_name": "passage"}).json()
    assert [token["text"] for token in tokens] == ["[CLS]", "passage", ":", "hello", "[SEP]"]


def test_an_unknown_prompt_name_is_a_422_naming_the_models_prompts(server):
    answer = httpx.post(server.url + "/embed", json={"inputs": "x", "prompt_name": "search"})
    assert answer.status_code == 422
    assert "prompt_name 'search' is not one of model" in answer.json()["error"]
    assert "(document, passage, query)" in answer.json()["error"]


def test_the_default_prompt_comes_from_the_settings_then_the_model(st_model):
    folder, _ = st_model
    spec = load_model_spec(str(folder))
    assert default_prompt(spec, Settings()) == "query: "
    assert default_prompt(spec, Settings(default_prompt_name="passage")) == "passage: "
    assert default_prompt(spec, Settings(default_prompt="Represent this: ")) == "Represent this: "
    assert default_prompt(load_model_spec(), Settings()) == ""  # the bundled model has no prompts
    with pytest.raises(ValueError, match="'search' is not one of model"):
        default_prompt(spec, Settings(default_prompt_name="search"))
    with pytest.raises(ValueError, match="not both"):
        Settings(default_prompt_name="query", default_prompt="q: ")


def _copy_with(folder: Path, target: Path, edit: str, change) -> Path:
    import json
    import shutil

    shutil.copytree(folder, target)
    path = target / edit
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return target


def test_a_model_that_pools_without_its_prompt_is_refused_a_prompt(st_model, tmp_path):
    folder, _ = st_model
    excluded = _copy_with(
        folder, tmp_path / "excluded", "1_Pooling/config.json", lambda c: c | {"include_prompt": False}
    )
    spec = load_model_spec(str(excluded))
    assert spec.include_prompt is False
    with pytest.raises(ValueError, match="include_prompt: false"):
        default_prompt(spec, Settings())
    assert default_prompt(spec, Settings(default_prompt_name="document")) == ""  # an empty prompt changes nothing


def test_a_default_prompt_name_the_model_lacks_is_a_model_error(st_model, tmp_path):
    folder, _ = st_model
    broken = _copy_with(folder, tmp_path / "broken", "config_sentence_transformers.json",
                        lambda c: c | {"default_prompt_name": "search"})
    with pytest.raises(ModelError, match="default_prompt_name 'search' is not one of its prompts"):
        load_model_spec(str(broken))
