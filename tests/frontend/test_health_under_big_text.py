"""A 2 MiB text is tokenized off the event loop: /health and /metrics keep answering while it is."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

HEALTH_BOUND = 0.5  # seconds: what a readiness probe tolerates
IDLE_BOUND = 0.1  # an idle /health slower than this says the machine cannot hold the bound


def _seconds(url: str, path: str = "/health") -> float:
    started = time.perf_counter()
    assert httpx.get(url + path, timeout=10).status_code == 200
    return time.perf_counter() - started


def _skip_if_loaded(url: str, path: str, when: str) -> None:
    """Skip when the machine cannot hold the bound now: the slowest of many idle polls, as the
    bound is checked on the slowest poll beside the text. /metrics writes every family, some
    milliseconds of work of its own: its idle bound is wider."""
    idle = max(_seconds(url, path) for _ in range(20))
    if idle > (IDLE_BOUND if path == "/health" else HEALTH_BOUND / 2):
        pytest.skip(f"this machine answered an idle {path} in up to {idle:.3f} s {when}: too loaded to time the bound")


ATTEMPTS = 3  # a loop the text blocks misses the bound in every one; a neighbour's burst of load, in few


def _worst_beside_the_text(url: str, path: str, text: str, truncate: bool) -> tuple[float, httpx.Response]:
    """The slowest answer to `path` while `text` is embedded (or refused), and the text's answer."""
    answer: list[httpx.Response] = []
    body = {"inputs": text, "truncate": truncate}
    post = threading.Thread(target=lambda: answer.append(httpx.post(url + "/embed", json=body, timeout=120)))
    post.start()
    worst = 0.0
    polls = 0
    while post.is_alive():
        worst = max(worst, _seconds(url, path))
        polls += 1
    post.join()
    assert polls >= 3, f"the big request finished before {path} could be timed beside it"
    return worst, answer[0]


@pytest.mark.parametrize(
    ("path", "truncate"), [("/health", True), ("/metrics", True), ("/health", False)]
)
def test_a_2_mib_text_does_not_hold_up_health_or_metrics(server, path: str, truncate: bool):
    """Embedded (truncated), or refused as too long, which counts its tokens: counted in one
    piece, that had held the interpreter lock for seconds, in every attempt. A miss is measured
    again: a machine whose load comes in bursts (another test's processes) missed it once."""
    # Short words for the refusal: a token every 3 characters (700 K of them) makes its count long.
    words = "retrieval augmented generation systems " if truncate else "ab "
    text = (words * 700_000)[: 2 * 1024 * 1024 - 256]
    worsts = []
    for _ in range(ATTEMPTS):
        _skip_if_loaded(server.url, path, "before the text")
        worst, answer = _worst_beside_the_text(server.url, path, text, truncate)
        worsts.append(round(worst, 3))
        if truncate:
            assert answer.status_code == 200, answer.text
            assert len(answer.json()[0]) == 384
        else:
            assert answer.status_code == 422 and "has at least" in answer.json()["error"], answer.text
        if worst <= HEALTH_BOUND:
            return
    _skip_if_loaded(server.url, path, "after the text")  # the machine may have become loaded since
    raise AssertionError(f"{path} took {worsts} s in {ATTEMPTS} attempts while a 2 MiB text was embedded")
