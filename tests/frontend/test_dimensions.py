"""`dimensions` over plain HTTP, on both APIs: Matryoshka sizes from the setting, the full size always."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.frontend.conftest import MATRYOSHKA_KEY

TEXTS = ["What is the capital of France?", "Paris is the capital and largest city of France."]


@pytest.fixture(scope="module")
def client(matryoshka_server):
    headers = {"Authorization": f"Bearer {MATRYOSHKA_KEY}"}
    with httpx.Client(base_url=matryoshka_server.url, headers=headers, timeout=60) as http:
        yield http


def embed(client, **options) -> np.ndarray:
    answer = client.post("/embed", json={"inputs": TEXTS, **options})
    assert answer.status_code == 200, answer.text
    return np.array(answer.json())


def test_info_lists_the_allowed_sizes(client):
    assert client.get("/info").json()["model"]["dimensions"] == [128, 256, 384]


def test_embed_cuts_raw_vectors_as_they_are(client):
    raw = embed(client, normalize=False)
    assert np.allclose(embed(client, normalize=False, dimensions=128), raw[:, :128], atol=1e-5)


@pytest.mark.parametrize("dimensions", [128, 256])
def test_embed_renormalizes_cut_normalized_vectors(client, dimensions):
    raw = embed(client, normalize=False)
    head = raw[:, :dimensions] / np.linalg.norm(raw[:, :dimensions], axis=1, keepdims=True)
    cut = embed(client, dimensions=dimensions)
    assert cut.shape == (2, dimensions)
    assert np.allclose(cut, head, atol=1e-5)


def test_full_size_is_always_allowed(client):
    assert np.allclose(embed(client, dimensions=384), embed(client), atol=1e-6)


@pytest.mark.parametrize("dimensions", [200, 0, -128, 512])
def test_other_sizes_are_refused_naming_the_allowed_ones(client, dimensions):
    tei = client.post("/embed", json={"inputs": TEXTS, "dimensions": dimensions})
    assert tei.status_code == 422 and tei.json()["error_type"] == "validation"
    assert f"dimensions={dimensions} is not supported" in tei.json()["error"] and "128, 256, 384" in tei.json()["error"]
    openai = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": dimensions})
    assert openai.status_code == 400 and openai.json()["error"]["param"] == "dimensions"


def test_openai_route_cuts_and_renormalizes(client):
    full = np.array([d["embedding"] for d in client.post("/v1/embeddings", json={"input": TEXTS}).json()["data"]])
    body = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 256}).json()
    cut = np.array([d["embedding"] for d in body["data"]])
    assert np.allclose(cut, full[:, :256] / np.linalg.norm(full[:, :256], axis=1, keepdims=True), atol=1e-5)
