"""/tokenize is bounded in tokens: a body of millions of characters is refused (413) from a count
that stops early, before any answer is built, so the server neither stalls nor grows; the answers
one process builds at once are bounded too (429 past that)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from windve.frontend.errors import ApiError
from windve.frontend.tokenize_limits import TokenBudget

BODY_LIMIT = 2 * 1024 * 1024  # the default max_request_bytes
# ~419k tokens in a body just under the byte limit: refused for its tokens, not its bytes.
HUGE_TEXT = "word " * ((BODY_LIMIT - 64) // 5)
GROWTH_LIMIT = 100 * 1024 * 1024  # the unbounded answer grew the server by ~400 MB


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as http:
        yield http


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (the server may run several)."""
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total += int(line.split()[1]) * 1024
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            total += tree_rss(int(child))
    return total


def assert_token_refusal(response: httpx.Response, limit: int) -> None:
    assert response.status_code == 413, response.text[:200]
    body = response.json()
    assert body["error_type"] == "payload_too_large"
    assert f"more than {limit} tokens" in body["error"] and "max_tokenize_tokens" in body["error"]


def test_a_text_of_two_mib_is_refused_for_its_tokens(server, client):
    limit = client.get("/info").json()["max_tokenize_tokens"]
    before = tree_rss(server.process.pid)
    assert_token_refusal(client.post("/tokenize", json={"inputs": HUGE_TEXT}), limit)
    assert tree_rss(server.process.pid) - before < GROWTH_LIMIT


def test_four_at_once_are_refused_without_growing_the_server(server, client):
    limit = client.get("/info").json()["max_tokenize_tokens"]
    before = tree_rss(server.process.pid)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: client.post("/tokenize", json={"inputs": HUGE_TEXT}), range(4)))
    for answer in answers:
        assert_token_refusal(answer, limit)
    assert tree_rss(server.process.pid) - before < GROWTH_LIMIT
    assert client.post("/tokenize", json={"inputs": "still answering"}).status_code == 200


def test_many_texts_are_counted_together(client):
    limit = client.get("/info").json()["max_tokenize_tokens"]
    texts = ["word " * 2000] * (limit // 2000 + 1)
    assert_token_refusal(client.post("/tokenize", json={"inputs": texts}), limit)


def test_a_large_request_within_the_limit_is_answered_in_full(client):
    rows = client.post("/tokenize", json={"inputs": ["word " * 30_000, "a b"]}).json()
    assert [len(row) for row in rows] == [30_002, 4]


def test_the_tokenize_route_keeps_the_embed_limits(client):
    limit = client.get("/info").json()["max_client_batch_size"]
    too_many = client.post("/tokenize", json={"inputs": ["x"] * (limit + 1)})
    assert too_many.status_code == 413 and f"maximum allowed batch size {limit}" in too_many.json()["error"]
    too_big = client.post("/tokenize", json={"inputs": "word " * (BODY_LIMIT // 4)})
    assert too_big.status_code == 413 and "exceeds the limit" in too_big.json()["error"]


def test_budget_refuses_past_its_capacity_and_frees_what_it_held():
    budget = TokenBudget(100)
    with budget.hold(60):
        with budget.hold(40):
            with pytest.raises(ApiError) as refused, budget.hold(1):
                pass
            assert refused.value.status == 429 and refused.value.headers()["Retry-After"] == "1"
        assert budget.in_use == 60
    assert budget.in_use == 0
    with budget.hold(150):  # alone, a request bigger than the budget still runs (the token limit bounds it)
        assert budget.in_use == 150
