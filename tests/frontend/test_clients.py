"""The real client libraries against a real server: the openai SDK and huggingface_hub's InferenceClient.

The server declares Matryoshka sizes 128 and 256 and needs an API key (tests/frontend/conftest.py).
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
from openai import AuthenticationError, BadRequestError, NotFoundError, OpenAI

from tests.frontend.conftest import MATRYOSHKA_KEY

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TEXTS = ["What is the capital of France?", "Paris is the capital and largest city of France."]


@pytest.fixture(scope="module")
def openai(matryoshka_server) -> OpenAI:
    # No retries: a refusal must surface as the SDK's exception, not as a retry loop.
    return OpenAI(base_url=matryoshka_server.url + "/v1", api_key=MATRYOSHKA_KEY, max_retries=0)


@pytest.fixture(scope="module")
def expected(reference_model) -> np.ndarray:
    return reference_model.encode(TEXTS, normalize_embeddings=True)


def vectors(response) -> np.ndarray:
    return np.array([item.embedding for item in response.data])


def assert_same_directions(got, want) -> None:
    """Row by row, as the contract tests compare: the server may infer in bf16."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    cosines = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() > 0.999, cosines


def test_openai_embeddings_create(openai, expected):
    response = openai.embeddings.create(model=MODEL, input=TEXTS)
    assert response.model == MODEL and [item.index for item in response.data] == [0, 1]
    assert response.usage.prompt_tokens == response.usage.total_tokens > 10
    assert_same_directions(vectors(response), expected)


@pytest.mark.parametrize("dimensions", [128, 256, 384])
def test_openai_dimensions_cut_and_renormalize(openai, expected, dimensions):
    response = openai.embeddings.create(model=MODEL, input=TEXTS, dimensions=dimensions)
    got = vectors(response)
    head = expected[:, :dimensions] / np.linalg.norm(expected[:, :dimensions], axis=1, keepdims=True)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert_same_directions(got, head)


def test_openai_dimensions_in_base64(openai):
    floats = vectors(openai.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=128))
    encoded = openai.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=128, encoding_format="base64")
    decoded = np.frombuffer(base64.b64decode(encoded.data[0].embedding), "<f4")
    assert np.allclose(decoded, floats[0], atol=1e-6)


@pytest.mark.parametrize("dimensions", [200, 0, 1024])
def test_openai_dimensions_not_allowed_is_bad_request(openai, dimensions):
    with pytest.raises(BadRequestError) as refused:
        openai.embeddings.create(model=MODEL, input=TEXTS, dimensions=dimensions)
    assert refused.value.status_code == 400 and refused.value.param == "dimensions"
    assert "128, 256, 384" in refused.value.message


@pytest.mark.parametrize("bad_input", [[], "", ["ok", ""]])
def test_openai_bad_input_is_bad_request(openai, bad_input):
    with pytest.raises(BadRequestError) as refused:
        openai.embeddings.create(model=MODEL, input=bad_input)
    assert refused.value.param == "input"


def test_openai_wrong_key_is_authentication_error(matryoshka_server):
    stranger = OpenAI(base_url=matryoshka_server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(AuthenticationError) as refused:
        stranger.embeddings.create(model=MODEL, input=TEXTS)
    assert refused.value.code == "invalid_api_key"
    with pytest.raises(AuthenticationError):
        stranger.models.list()


def test_openai_models_list_and_retrieve(openai):
    assert [model.id for model in openai.models.list()] == [MODEL]
    served = openai.models.retrieve(MODEL)
    assert served.id == MODEL and served.owned_by == "windve"
    for unknown in ("text-embedding-3-small", "a\nb"):
        with pytest.raises(NotFoundError) as missing:
            openai.models.retrieve(unknown)
        assert missing.value.code == "model_not_found"


def test_openai_sdk_given_the_base_url_without_v1(matryoshka_server, expected):
    """Infinity's paths: a base URL without /v1 reaches /embeddings and /models."""
    bare = OpenAI(base_url=matryoshka_server.url, api_key=MATRYOSHKA_KEY, max_retries=0)
    assert_same_directions(vectors(bare.embeddings.create(model=MODEL, input=TEXTS)), expected)
    assert bare.models.retrieve(MODEL).id == MODEL
    with pytest.raises(BadRequestError):
        bare.embeddings.create(model=MODEL, input=TEXTS, dimensions=100)


def test_huggingface_inference_client(matryoshka_server, expected, monkeypatch):
    from huggingface_hub import InferenceClient, constants
    from huggingface_hub.errors import HfHubHTTPError

    # The suite runs with HF_HUB_OFFLINE=1, which blocks every request the client makes, even to
    # 127.0.0.1; this one never goes near the Hub.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    client = InferenceClient(model=matryoshka_server.url, token=MATRYOSHKA_KEY)
    full = client.feature_extraction(TEXTS, normalize=True, truncate=True)
    assert_same_directions(full, expected)
    cut = client.feature_extraction(TEXTS, normalize=True, dimensions=128)
    assert cut.shape == (2, 128) and np.allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
    with pytest.raises(HfHubHTTPError) as refused:
        client.feature_extraction(TEXTS, dimensions=100)
    assert refused.value.response.status_code == 422
    with pytest.raises(HfHubHTTPError) as stranger:
        InferenceClient(model=matryoshka_server.url, token="wrong").feature_extraction(TEXTS)
    assert stranger.value.response.status_code == 401
