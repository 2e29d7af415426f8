"""The HTTP contract over real HTTP on 127.0.0.1, with the real model behind it."""

from __future__ import annotations

import base64
import socket
import time

import httpx
import numpy as np
import pytest

from tests.servers import metric_sum

TEXTS = ["What is the capital of France?", "Paris is the capital and largest city of France."]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        yield http


@pytest.fixture(scope="module")
def expected(reference_model):
    return reference_model.encode(TEXTS, normalize_embeddings=True)


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_embed_single_string_and_list(client, expected):
    one = client.post("/embed", json={"inputs": TEXTS[0]})
    assert one.status_code == 200
    assert np.array(one.json()).shape == (1, 384)
    many = client.post("/embed", json={"inputs": TEXTS})
    vectors = np.array(many.json())
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert cosines(vectors, expected).min() > 0.999


def test_embed_normalize_false_keeps_raw_norm(client):
    raw = np.array(client.post("/embed", json={"inputs": TEXTS, "normalize": False}).json())
    assert np.linalg.norm(raw, axis=1).min() > 1.5  # MiniLM's pooled vectors are far from unit length


TIMING_HEADERS = ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time", "x-compute-time")


def timings(response: httpx.Response) -> dict[str, int]:
    return {name: int(response.headers[name]) for name in TIMING_HEADERS}


def test_embedding_answers_carry_teis_timing_headers(client):
    """Scripts written against TEI read them; a missing one was a KeyError there."""
    texts = ["word " * 200] * 8  # long enough that the batch takes whole milliseconds, within the 256 tokens
    tokens = sum(len(row) for row in client.post("/tokenize", json={"inputs": texts}).json())
    tei = client.post("/embed", json={"inputs": texts})
    openai = client.post("/v1/embeddings", json={"input": texts})
    for answer in (tei, openai):
        assert answer.headers["x-compute-type"] == "cpu"  # the pool that computed them
        assert int(answer.headers["x-compute-characters"]) == sum(len(text) for text in texts)
        assert int(answer.headers["x-compute-tokens"]) == tokens
        took = timings(answer)
        assert took["x-total-time"] == took["x-compute-time"]
        assert took["x-inference-time"] > 0
        # Whole milliseconds, each cut down: the parts may sum to up to 2 ms past their own total.
        assert took["x-tokenization-time"] + took["x-queue-time"] + took["x-inference-time"] <= took["x-total-time"] + 2
    assert int(openai.headers["x-compute-tokens"]) == openai.json()["usage"]["prompt_tokens"]


def test_openai_float_and_base64(client, expected):
    body = client.post("/v1/embeddings", json={"input": TEXTS, "model": "any"}).json()
    assert body["object"] == "list"
    assert [item["index"] for item in body["data"]] == [0, 1]
    assert body["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 10
    floats = np.array([item["embedding"] for item in body["data"]])
    assert cosines(floats, expected).min() > 0.999
    encoded = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"}).json()
    decoded = np.array([np.frombuffer(base64.b64decode(item["embedding"]), "<f4") for item in encoded["data"]])
    assert np.allclose(decoded, floats, atol=1e-6)


def test_openai_single_string(client):
    body = client.post("/v1/embeddings", json={"input": "hello"}).json()
    assert len(body["data"]) == 1 and len(body["data"][0]["embedding"]) == 384


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"inputs": ""}, "inputs[0] is an empty string"),
        ({"inputs": []}, "inputs must not be empty"),
        ({"inputs": ["ok", 3]}, "inputs[1]"),
        ({"inputs": ["ok", None]}, "inputs[1]"),
        ({"text": "wrong field"}, "inputs: field required"),
        ({"inputs": "x", "normalize": "yes"}, "normalize"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_tei_validation_errors(client, payload, fragment):
    response = client.post("/embed", json=payload)
    assert response.status_code == 422
    body = response.json()
    assert body["error_type"] == "validation"
    assert fragment in body["error"]


def test_tei_malformed_json(client):
    response = client.post("/embed", content=b'{"inputs": ["a",', headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["error"]


def test_empty_body(client):
    response = client.post("/embed", content=b"")
    assert response.status_code == 422 and "empty" in response.json()["error"]


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["a", 1]}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 12}, "dimensions"),
    ],
)
def test_openai_validation_errors(client, payload, param):
    """OpenAI answers bad input with 400, which its SDK raises as BadRequestError."""
    response = client.post("/v1/embeddings", json=payload)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


@pytest.mark.parametrize("token_ids", [[101, 2023, 102], [[101, 2023, 102], [101, 102]], 2023])
def test_openai_token_id_input_says_to_send_texts(client, token_ids):
    error = client.post("/v1/embeddings", json={"input": token_ids}).json()["error"]
    assert error["param"] == "input"
    assert "token ids are not accepted, only texts" in error["message"]
    assert "check_embedding_ctx_length=False" in error["message"]


def test_tei_takes_the_models_token_ids_as_it_takes_texts(client):
    """TEI's /embed takes token ids (one list, or lists among the texts); they had been refused."""
    ids = [[token["id"] for token in row] for row in client.post("/tokenize", json={"inputs": TEXTS}).json()]
    texts = np.array(client.post("/embed", json={"inputs": TEXTS}).json())
    np.testing.assert_allclose(client.post("/embed", json={"inputs": ids}).json(), texts, atol=1e-6)
    np.testing.assert_allclose(client.post("/embed", json={"inputs": ids[0]}).json(), texts[:1], atol=1e-6)
    mixed = client.post("/embed", json={"inputs": [TEXTS[0], ids[1]]})
    np.testing.assert_allclose(mixed.json(), texts, atol=1e-6)
    assert int(mixed.headers["x-compute-tokens"]) == len(ids[0]) + len(ids[1])
    assert int(mixed.headers["x-compute-characters"]) == len(TEXTS[0])  # ids are no characters


def test_token_ids_are_cut_as_texts_are_and_checked_against_the_vocabulary(client):
    long = [101] + [2773] * 400 + [102]  # "word" x 400: past the model's 256 tokens
    refused = client.post("/embed", json={"inputs": ["short", long], "truncate": False})
    assert refused.status_code == 422
    assert refused.json()["error"].startswith("inputs[1]: input 1 has 402 tokens, more than the model's limit of 256")
    for side, kept in (("right", long[:256]), ("left", long[-256:])):
        cut = client.post("/embed", json={"inputs": long, "truncate": True, "truncation_direction": side}).json()
        np.testing.assert_allclose(cut, client.post("/embed", json={"inputs": kept}).json(), atol=1e-6)
    for past in (30522, 2**63 + 5):
        answer = client.post("/embed", json={"inputs": [[101, 102], [101, past, 102]]})
        assert answer.status_code == 422
        assert answer.json()["error"] == f"inputs[1]: token id {past} is past this model's vocabulary (0 to 30521)"


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([[101, 102], []], "inputs[1] is an empty list of token ids"),
        ([101, -1], "inputs[1] is -1, not a token id (an integer >= 0)"),
        ([[101], [102, "x"]], "inputs[1][1] is 'x', not a token id (an integer >= 0)"),
        (["a", 3], "inputs[1] is 3, not a text or a list of token ids"),
        (7, "inputs: must be a text, a list of texts, or token ids"),
    ],
)
def test_tei_inputs_that_are_neither_texts_nor_token_ids(client, inputs, message):
    response = client.post("/embed", json={"inputs": inputs})
    assert response.status_code == 422 and response.json()["error"] == message


@pytest.mark.parametrize("token_ids", [[101, 2023, 102], [[101, 2023, 102], [101, 102]]])
def test_tokenize_takes_texts_only(client, token_ids):
    response = client.post("/tokenize", json={"inputs": token_ids})
    assert response.status_code == 422
    assert response.json()["error"].startswith("inputs: token ids are not accepted, only texts (/embed takes them")


def test_openai_null_encoding_format_is_the_default(client):
    # model, dimensions and user took null already; a client writing unset fields as null sends this too
    response = client.post("/v1/embeddings", json={"input": "a", "encoding_format": None, "dimensions": None})
    assert response.status_code == 200
    assert isinstance(response.json()["data"][0]["embedding"], list)


def test_too_many_inputs_is_413(client):
    info = client.get("/info").json()
    limit = info["max_client_batch_size"]
    response = client.post("/embed", json={"inputs": ["a"] * (limit + 1)})
    assert response.status_code == 413
    assert f"maximum allowed batch size {limit}" in response.json()["error"]
    openai = client.post("/v1/embeddings", json={"input": ["a"] * (limit + 1)})
    assert openai.status_code == 400 and openai.json()["error"]["code"] == "payload_too_large"


def test_body_over_byte_limit_is_413(client):
    big = "word " * (1024 * 1024)  # ~5 MiB, over the 2 MiB default
    response = client.post("/embed", json={"inputs": big})
    assert response.status_code == 413
    assert "limit" in response.json()["error"]


def test_chunked_body_over_limit_is_413(client):
    def chunks():
        yield b'{"inputs": "'
        for _ in range(3 * 1024):
            yield b"x" * 1024
        yield b'"}'

    response = client.post("/embed", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413


def test_too_long_without_truncation_names_the_limit(client):
    long_text = "token " * 600
    response = client.post("/embed", json={"inputs": ["short", long_text], "truncate": False})
    assert response.status_code == 422
    message = response.json()["error"]
    assert "inputs[1]" in message and "256" in message
    truncated = client.post("/embed", json={"inputs": long_text, "truncate": True})
    assert truncated.status_code == 200


def test_openai_models_lists_and_retrieves_the_served_model(client):
    listed = client.get("/v1/models")
    assert listed.status_code == 200
    body = listed.json()
    assert body["object"] == "list" and len(body["data"]) == 1
    model = body["data"][0]
    assert model["id"] == client.get("/info").json()["model"]["id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert model["object"] == "model" and model["owned_by"] == "windve"
    assert 0 < model["created"] <= time.time()
    assert client.get(f"/v1/models/{model['id']}").json() == model


def test_root_answers_as_embed_and_health(client):
    assert client.post("/", json={"inputs": TEXTS}).json() == client.post("/embed", json={"inputs": TEXTS}).json()
    assert client.get("/").json() == client.get("/health").json() == {"status": "ok"}
    for path in ("/", "/health"):  # load balancers probe with HEAD
        answer = client.head(path)
        assert answer.status_code == 200 and answer.content == b""


def test_huggingface_inference_client_given_the_base_url(server, expected, monkeypatch):
    """huggingface_hub's InferenceClient, as LangChain's HuggingFaceEndpointEmbeddings uses it with TEI."""
    from huggingface_hub import InferenceClient, constants

    # The suite runs with HF_HUB_OFFLINE=1, which blocks every request the client makes, even to
    # 127.0.0.1; this one never goes near the Hub.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    vectors = InferenceClient(model=server.url).feature_extraction(TEXTS[0], normalize=True, truncate=True)
    assert vectors.shape == (1, 384)
    assert cosines(vectors, expected[:1]).min() > 0.999


@pytest.mark.parametrize(
    ("extra", "status", "fragment"),
    [
        ({"truncation_direction": "right"}, 200, None),
        ({"truncation_direction": "Right"}, 200, None),
        ({"truncation_direction": "left"}, 200, None),
        ({"truncation_direction": "middle"}, 422, "truncation_direction: 'middle' is neither 'left' nor 'right'"),
        ({"prompt_name": "query"}, 422, "prompt_name 'query' is not one of model"),
        ({"prompt_name": None}, 200, None),
    ],
)
def test_tei_options_it_cannot_honour_are_refused(client, extra, status, fragment):
    answer = client.post("/embed", json={"inputs": TEXTS[0], **extra})
    assert answer.status_code == status
    if fragment:
        assert fragment in answer.json()["error"]


def test_truncation_direction_cuts_a_long_text_at_the_side_asked(client):
    """TEI's truncation_direction: `left` keeps a long text's end (it had been refused)."""
    words = 256 - 2  # the model's limit, less [CLS] and [SEP]: one token a word
    text = "dog " * 300 + "cat " * words

    def embedded(body: dict) -> np.ndarray:
        answer = client.post("/embed", json=body)
        assert answer.status_code == 200, answer.text
        return np.array(answer.json()[0])

    left = embedded({"inputs": text, "truncate": True, "truncation_direction": "Left"})
    right = embedded({"inputs": text, "truncate": True, "truncation_direction": "right"})
    np.testing.assert_allclose(left, embedded({"inputs": "cat " * words}), atol=1e-6)
    np.testing.assert_allclose(right, embedded({"inputs": "dog " * words}), atol=1e-6)
    np.testing.assert_allclose(right, embedded({"inputs": text, "truncate": True}), atol=1e-6)  # the model's side


def test_tokenize_gives_the_models_tokens_with_their_offsets(client, reference_model):
    text = "Héllo wörld, WindVE! 日本"
    [tokens] = client.post("/tokenize", json={"inputs": text}).json()
    assert [t["id"] for t in tokens] == reference_model.tokenizer(text)["input_ids"]
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[-1]["text"] == "[SEP]" and tokens[-1]["special"]
    for token in tokens[1:-1]:
        assert not token["special"] and text[token["start"]:token["stop"]] == token["text"]
    assert [t["text"] for t in tokens[1:4]] == ["Héllo", "wörld", ","]
    plain = client.post("/tokenize", json={"inputs": [text, "a b"], "add_special_tokens": False}).json()
    assert plain[0] == tokens[1:-1] and [t["text"] for t in plain[1]] == ["a", "b"]


def test_tokenize_counts_past_the_models_limit(client):
    """Chunkers count tokens to split texts; the count must not stop at the embedding limit."""
    [tokens] = client.post("/tokenize", json={"inputs": "word " * 600}).json()
    assert len(tokens) == 602


@pytest.mark.parametrize(
    ("payload", "status", "fragment"),
    [
        ({"inputs": []}, 422, "inputs must not be empty"),
        ({"inputs": ["ok", ""]}, 422, "inputs[1] is an empty string"),
        ({"inputs": "x", "add_special_tokens": "yes"}, 422, "add_special_tokens"),
        ({"inputs": "x", "prompt_name": "query"}, 422, "prompts (none)"),
    ],
)
def test_tokenize_bad_input(client, payload, status, fragment):
    answer = client.post("/tokenize", json=payload)
    assert answer.status_code == status
    assert fragment in answer.json()["error"]


def test_decode_gives_the_text_of_token_ids_as_the_models_tokenizer_does(client, reference_model):
    texts = ["Héllo wörld, WindVE! 日本", "a b"]
    rows = client.post("/tokenize", json={"inputs": texts}).json()
    ids = [[token["id"] for token in row] for row in rows]
    hf = reference_model.tokenizer
    decoded = client.post("/decode", json={"ids": ids})
    assert decoded.status_code == 200 and decoded.json() == hf.batch_decode(ids, skip_special_tokens=True)
    assert decoded.json()[1] == "a b"
    one = client.post("/decode", json={"ids": ids[0], "skip_special_tokens": False}).json()
    assert one == [hf.decode(ids[0], skip_special_tokens=False)] and one[0].startswith("[CLS]")
    assert client.post("/decode", json={"ids": [ids[1], []]}).json() == ["a b", ""]


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"ids": []}, "ids: must not be empty"),
        ({"ids": "101 102"}, "ids: must be a list of token ids"),
        ({"ids": [101, "x"]}, "ids[1] is 'x', not a token id"),
        ({"ids": [[101], [-1]]}, "ids[1][0] is -1, not a token id"),
        ({"ids": [[101], 102]}, "ids[1] is 102, not a list"),
        ({"ids": [101, 1.5]}, "ids[1] is 1.5"),
        ({"ids": [[101], [102, 30522]]}, "ids[1][1] is 30522, past this model's vocabulary (30522 tokens"),
        ({"ids": [2**63 - 1]}, f"ids[0] is {2**63 - 1}, past this model's vocabulary"),
        ({"ids": [2**70]}, "ids[0] is"),  # past 64 bits, a JSON reader's float
        ({"ids": [101], "skip_special_tokens": "yes"}, "skip_special_tokens"),
        ({}, "ids: field required"),
    ],
)
def test_decode_bad_input(client, payload, fragment):
    answer = client.post("/decode", json=payload)
    assert answer.status_code == 422, answer.text
    assert fragment in answer.json()["error"] and answer.json()["error_type"] == "validation"


def test_decode_limits_its_ids_and_sequences(client):
    info = client.get("/info").json()
    tokens, batch = info["max_tokenize_tokens"], info["max_client_batch_size"]
    flat = client.post("/decode", json={"ids": [1037] * (tokens + 1)})
    assert flat.status_code == 413 and f"more than {tokens}" in flat.json()["error"]
    nested = client.post("/decode", json={"ids": [[1037] * 1000] * (tokens // 1000 + 1)})
    assert nested.status_code == 413 and "max_tokenize_tokens" in nested.json()["error"]
    many = client.post("/decode", json={"ids": [[1037]] * (batch + 1)})
    assert many.status_code == 413 and f"maximum allowed batch size {batch}" in many.json()["error"]
    assert client.post("/decode", json={"ids": [1037] * tokens}).status_code == 200


def test_dimensions_without_matryoshka_sizes_allow_only_the_full_size(client):
    assert client.get("/info").json()["model"]["dimensions"] == [384]
    full = client.post("/embed", json={"inputs": TEXTS}).json()
    assert client.post("/embed", json={"inputs": TEXTS, "dimensions": 384}).json() == full
    tei = client.post("/embed", json={"inputs": TEXTS, "dimensions": 256})
    assert tei.status_code == 422 and "declares no Matryoshka dimensions" in tei.json()["error"]
    openai = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 384})
    assert len(openai.json()["data"][0]["embedding"]) == 384
    refused = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 256})
    assert refused.status_code == 400 and "declares no Matryoshka dimensions" in refused.json()["error"]["message"]


def test_infinity_default_paths_answer_as_their_v1_twins(client):
    """A client given an Infinity base URL (no /v1) posts to /embeddings and lists /models."""
    payload = {"input": TEXTS, "model": "any"}
    twin = client.post("/v1/embeddings", json=payload).json()
    infinity = client.post("/embeddings", json=payload).json()
    assert infinity["model"] == twin["model"] and infinity["usage"] == twin["usage"]
    assert np.allclose([d["embedding"] for d in infinity["data"]], [d["embedding"] for d in twin["data"]], atol=1e-6)
    assert client.get("/models").json() == client.get("/v1/models").json()
    bad = client.post("/embeddings", json={"input": []})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"


def test_openai_unknown_model_is_404_in_openai_shape(client):
    missing = client.get("/v1/models/text-embedding-3-small")
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "text-embedding-3-small" in error["message"] and "all-MiniLM-L6-v2" in error["message"]


def test_health_info_metrics(client):
    assert client.get("/health").json() == {"status": "ok"}
    info = client.get("/info").json()
    assert info["model"]["dim"] == 384
    assert info["model"]["max_input_length"] == 256
    assert info["model"]["tokenizer_fast_path"] == "bert-wordpiece"  # MiniLM's tokenizer is BERT's
    assert info["slo_seconds"] == 1.0
    assert info["pools"][0]["name"] == "cpu" and info["pools"][0]["depth"] >= 1
    assert info["version"]
    tei_keys = {"model_id", "model_sha", "model_dtype", "max_input_length", "max_client_batch_size", "auto_truncate"}
    assert tei_keys <= set(info)
    assert info["model_id"] == info["model"]["id"] and info["max_input_length"] == 256
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["auto_truncate"] is True
    client.post("/embed", json={"inputs": "count me"})
    metrics = client.get("/metrics").text
    for name in (
        "windve_requests_total",
        "windve_errors_total",
        "windve_input_tokens_total",
        "windve_tokenization_seconds_bucket",
        "windve_request_input_tokens_bucket",
        "windve_request_seconds_bucket",
        "windve_front_end_seconds_bucket",
        "windve_queue_seconds_bucket",
        "windve_inference_seconds_bucket",
        "windve_batch_size_bucket",
        "windve_pool_depth",
    ):
        assert name in metrics, name


def histogram_sums(client, *names: str) -> list[tuple[float, float]]:
    """(sum, count) of each histogram in `names` over all its label values, from one read of /metrics."""
    text = client.get("/metrics").text
    return [(metric_sum(text, name + "_sum"), metric_sum(text, name + "_count")) for name in names]


LAG = 0.4  # seconds between a request's first bytes and the end of its headers


def test_request_and_front_end_times_count_from_the_first_bytes(server, client):
    """windve_request_seconds and windve_front_end_seconds time a request from when its first bytes
    arrived, as its client and depth control count it, not from when its handler began. A client
    that sends its head in two parts, LAG apart, stands here for a request that waited behind a busy
    event loop: its handler starts only once the head is complete."""
    timed = ("windve_request_seconds", "windve_front_end_seconds")
    e2e_before, front_before = histogram_sums(client, *timed)
    body = b'{"inputs": "timed from its first bytes"}'
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: t\r\n")
        time.sleep(LAG)  # the slow client itself, not a wait for the server
        head = b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    e2e_after, front_after = histogram_sums(client, *timed)
    e2e_seconds, front_seconds = e2e_after[0] - e2e_before[0], front_after[0] - front_before[0]
    assert e2e_after[1] - e2e_before[1] == 1 and front_after[1] - front_before[1] == 1
    assert LAG <= front_seconds <= e2e_seconds, (front_seconds, e2e_seconds)


def test_openapi_document(client):
    spec = client.get("/openapi.json").json()
    routes = {"/embed", "/", "/tokenize", "/decode", "/v1/embeddings", "/embeddings", "/v1/models", "/models"}
    routes |= {"/health", "/info", "/metrics"}
    assert routes <= set(spec["paths"])
    embed_body = spec["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "inputs" in embed_body["properties"]
    assert client.get("/docs").status_code == 200


def answered_embed_requests(client) -> float:
    return metric_sum(client.get("/metrics").text, "windve_requests_total", route="embed")


def ended_as(client, status: str) -> float:
    return metric_sum(client.get("/metrics").text, "windve_requests_total", route="embed", status=status)


def test_client_disconnect_frees_slots(server, client):
    """A client that goes away mid-request leaves nothing in flight."""
    before = answered_embed_requests(client)
    answered_before, gone_before = ended_as(client, "200"), ended_as(client, "499")
    payload = b'{"inputs": ["' + b"word " * 200 + b'"]}'
    sockets = []
    for _ in range(8):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(
            b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        sockets.append(sock)
    for sock in sockets:
        sock.close()
    # Every request ends, answered or dropped (499); then nothing may stay in flight.
    deadline = time.monotonic() + 60
    while answered_embed_requests(client) < before + 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert answered_embed_requests(client) == before + 8
    # A query already in a running batch holds its slot until the batch ends, then frees it.
    while time.monotonic() < deadline:
        pools = client.get("/info").json()["pools"]
        if all(pool["in_flight"] == 0 for pool in pools):
            break
        time.sleep(0.05)
    assert all(pool["in_flight"] == 0 for pool in pools), pools
    # Each ended answered or as its client's leaving, none as an error.
    assert ended_as(client, "200") - answered_before + ended_as(client, "499") - gone_before == 8
    assert client.post("/embed", json={"inputs": "still serving"}).status_code == 200
