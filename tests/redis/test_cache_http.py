"""The embedding cache on the request path, over real HTTP, with a real redis-server."""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import numpy as np
import pytest
import redis

from tests.servers import metric_sum, start_server

# A set depth: the servers start without the warm-up probe (10-20 s each here), which these tests do
# not need.
NO_PROBE = ("--cpu-depth", "64")
TEXTS = ["cached question one", "cached question two", "a fresh question three"]


def metric(url: str, name: str, **labels: str) -> float:
    return metric_sum(httpx.get(url + "/metrics").text, name, **labels)


def dispatched(url: str) -> float:
    return metric(url, "windve_pool_dispatched_queries_total", pool="cpu")


@pytest.fixture(scope="module")
def local_cache_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("local-cache"), *NO_PROBE)  # in-process cache on, by default
    yield server
    server.stop()


def test_local_hits_are_identical_and_skip_the_queue(local_cache_server):
    url = local_cache_server.url
    first = httpx.post(url + "/embed", json={"inputs": TEXTS[:2]})
    assert first.status_code == 200
    queued = dispatched(url)
    again = httpx.post(url + "/embed", json={"inputs": TEXTS[:2]})
    assert again.content == first.content  # byte-identical answer
    assert dispatched(url) == queued  # no queue slot taken
    assert first.headers["x-compute-type"] == "cpu" and again.headers["x-compute-type"] == "cache"
    assert again.headers["x-queue-time"] == again.headers["x-inference-time"] == "0"
    partly = httpx.post(url + "/embed", json={"inputs": TEXTS})
    assert partly.json()[:2] == first.json()
    assert dispatched(url) == queued + 1  # only the miss went to a pool
    raw = httpx.post(url + "/embed", json={"inputs": TEXTS[:1], "normalize": False}).json()
    assert raw != first.json()[:1]  # normalize is part of the key
    ids = {"inputs": [101, 17053, 2094, 3160, 2028, 102]}  # the first text's token ids: a key of their own
    assert httpx.post(url + "/embed", json=ids).headers["x-compute-type"] == "cpu"
    cached_ids = httpx.post(url + "/embed", json=ids)
    assert cached_ids.headers["x-compute-type"] == "cache"
    np.testing.assert_allclose(cached_ids.json(), first.json()[:1], atol=1e-6)


def test_hits_are_not_tokenized_and_still_count_their_tokens(local_cache_server):
    """A hit keeps its text's token count: a request all cached is answered without the tokenizer
    (a third of a front end's CPU per request), and its usage is the miss's."""
    url = local_cache_server.url

    def embeddings(texts: list[str]) -> httpx.Response:
        answer = httpx.post(url + "/v1/embeddings", json={"input": texts, "model": "any"})
        assert answer.status_code == 200
        return answer

    def tokenized() -> float:
        return metric(url, "windve_tokenization_seconds_count")

    texts = ["counted once, then read from the cache", "a second text, which is rather longer than the first"]
    single = [embeddings([text]).json()["usage"]["prompt_tokens"] for text in texts]  # misses: tokenized
    before = tokenized()
    hit = embeddings(texts)
    assert tokenized() == before  # no text of the request was tokenized
    assert hit.json()["usage"] == {"prompt_tokens": sum(single), "total_tokens": sum(single)}
    assert hit.headers["x-compute-tokens"] == str(sum(single)) and hit.headers["x-compute-type"] == "cache"
    partly = embeddings([*texts, "and one text that is new"])
    assert tokenized() == before + 1  # the one miss
    fresh = embeddings(["and one text that is new"]).json()["usage"]["prompt_tokens"]
    assert partly.json()["usage"]["prompt_tokens"] == sum(single) + fresh
    # A text over the model's limit is refused whether or not the others were cached.
    too_long = httpx.post(url + "/embed", json={"inputs": [texts[0], "word " * 600], "truncate": False})
    assert too_long.status_code == 422 and "inputs[1]" in too_long.json()["error"]


def test_cache_control_keeps_a_request_out_of_the_cache(local_cache_server):
    url = local_cache_server.url
    private = {"inputs": "a text that must not be kept"}
    queued = dispatched(url)
    kept_out = httpx.post(url + "/embed", json=private, headers={"Cache-Control": "no-store"})
    assert kept_out.status_code == 200 and dispatched(url) == queued + 1
    again = httpx.post(url + "/embed", json=private)  # not stored: computed again, and stored now
    assert again.content == kept_out.content and dispatched(url) == queued + 2
    httpx.post(url + "/embed", json=private)
    assert dispatched(url) == queued + 2  # a hit
    fresh = httpx.post(url + "/embed", json=private, headers={"cache-control": "max-age=0, No-Cache"})
    assert fresh.content == kept_out.content and dispatched(url) == queued + 3  # not read from the cache
    # as HTTP caches read them (they had been answered from the cache): max-age=0 alone, and
    # HTTP/1.0's Pragma where there is no Cache-Control
    for headers in ({"Cache-Control": "max-age=0"}, {"Pragma": "no-cache"}):
        assert httpx.post(url + "/embed", json=private, headers=headers).content == kept_out.content
    assert dispatched(url) == queued + 5
    httpx.post(url + "/embed", json=private, headers={"Cache-Control": "max-age=60"})
    assert dispatched(url) == queued + 5  # a hit


@pytest.fixture
def redis_pair(redis_server, tmp_path):
    """Two replicas sharing one Redis, as behind a Kubernetes Service."""
    args = ("--redis-url", redis_server.url, "--redis-timeout-seconds", "0.05", *NO_PROBE)
    first = start_server(tmp_path, *args)
    second = start_server(tmp_path, *args)
    yield first, second
    first.stop()
    second.stop()


def test_replicas_share_the_cache_and_survive_redis_outages(redis_server, redis_pair):
    a, b = redis_pair
    computed = httpx.post(a.url + "/embed", json={"inputs": TEXTS})
    store = redis.Redis.from_url(redis_server.url)
    keys_before = set(store.scan_iter(match="windve:emb:*"))
    assert computed.status_code == 200
    queued_b = dispatched(b.url)
    shared = httpx.post(b.url + "/embed", json={"inputs": TEXTS})
    assert shared.content == computed.content
    assert dispatched(b.url) == queued_b
    assert metric(b.url, "windve_cache_hits_total", backend="redis") == len(TEXTS)

    # An entry of another size in the shared Redis (written by hand, or by anything but WindVE) is
    # computed afresh, not a 500.
    odd = {"inputs": "a text whose entry is overwritten"}
    assert httpx.post(a.url + "/embed", json=odd).status_code == 200
    (key,) = [key for key in store.scan_iter(match="windve:emb:*") if key not in keys_before]
    store.set(key, (7).to_bytes(4, "little") + np.zeros(100, dtype="<f4").tobytes())
    store.close()
    queued_b = dispatched(b.url)
    recomputed = httpx.post(b.url + "/embed", json=odd)
    assert recomputed.status_code == 200 and dispatched(b.url) == queued_b + 1
    original = np.array(httpx.post(a.url + "/embed", json=odd).json()[0])  # from a's own L1
    assert float(np.array(recomputed.json()[0]) @ original) > 0.999

    async def load(url: str, rounds: int, tag: str) -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            statuses = []
            for i in range(rounds):
                answers = await asyncio.gather(
                    *(client.post("/embed", json={"inputs": f"{tag} text {i}-{j}"}) for j in range(4))
                )
                statuses += [answer.status_code for answer in answers]
            return statuses

    async def outage() -> list[int]:
        task = asyncio.create_task(load(a.url, 12, "outage"))
        await asyncio.sleep(0)
        redis_server.kill()
        return await task

    statuses = asyncio.run(outage())
    assert statuses == [200] * len(statuses)  # Redis gone: zero failed requests
    assert metric(a.url, "windve_cache_errors_total", backend="redis") >= 1

    redis_server.start()  # same port, empty: caching must resume once the breaker probes again
    hits_before = metric(b.url, "windve_cache_hits_total", backend="redis")
    deadline = asyncio.run(_resume(a.url, b.url, hits_before))
    assert deadline, "caching did not resume after Redis came back"


async def _resume(writer: str, reader: str, hits_before: float) -> bool:
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + 30
    i = 0
    async with httpx.AsyncClient(timeout=60) as client:
        while loop.time() < stop_at:
            text = f"after restart {i}"
            i += 1
            await client.post(writer + "/embed", json={"inputs": text})
            await client.post(reader + "/embed", json={"inputs": text})
            if metric(reader, "windve_cache_hits_total", backend="redis") > hits_before:
                return True
            await asyncio.sleep(0.2)  # the breaker's cool-down is 1-5 s; poll the real condition
    return False


def test_replicas_whose_vectors_differ_share_no_entry(redis_server, model_spec, tmp_path):
    """Same weights, same folder name, on one Redis: a replica that pools by CLS, or computes in
    fp32, must not answer with the vectors another replica computed (it had: the key's revision
    hashed the weights alone)."""
    mean, cls = tmp_path / "a" / "encoder", tmp_path / "b" / "encoder"
    for folder in (mean, cls):
        shutil.copytree(model_spec.path, folder)
    (cls / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    shared = ("--redis-url", redis_server.url, *NO_PROBE)
    text = {"inputs": "the same text asked of three replicas"}
    replicas = [("--model", str(mean)), ("--model", str(cls)), ("--model", str(mean), "--dtype", "fp32")]
    answers = []
    for args in replicas:  # one after the other, on a Redis that keeps what each stored
        server = start_server(tmp_path, *shared, *args)
        try:
            queued = dispatched(server.url)
            answer = httpx.post(server.url + "/embed", json=text)
            assert answer.status_code == 200, answer.text
            assert dispatched(server.url) == queued + 1  # computed: no other replica's entry read
            answers.append(np.array(answer.json()[0]))
        finally:
            server.stop()
    assert float(answers[0] @ answers[1]) < 0.99  # mean and CLS pooling: other vectors
    assert np.abs(answers[0] - answers[2]).max() < 0.01  # dtype auto and fp32: the same vector, nearly
