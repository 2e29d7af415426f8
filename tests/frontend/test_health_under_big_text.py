"""A 2 MiB text is tokenized off the event loop: /health and /metrics keep answering while it is."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

HEALTH_BOUND = 0.5  # seconds: what a readiness probe tolerates
IDLE_BOUND = 0.1  # an idle /health slower than this says the machine cannot hold the bound


def _seconds(url: str, path: str = "/health") -> float:
    started = time.perf_counter()
    assert httpx.get(url + path, timeout=10).status_code == 200
    return time.perf_counter() - started


def _run_queue_seconds(pid: int) -> dict[str, float]:
    """Seconds each thread of process `pid`, and this test's thread (`"client"`), has spent runnable
    but not running, so far: the kernel's schedstat."""
    paths = {path.parent.name: path for path in Path(f"/proc/{pid}/task").glob("*/schedstat")}
    paths["client"] = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")
    waits = {}
    for thread, path in paths.items():
        try:
            waits[thread] = int(path.read_text().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile: its wait is not counted
            pass
    return waits


def _starved(pid: int, before: dict[str, float], after: dict[str, float]) -> float:
    """What waits for a CPU added to a poll between `before` and `after`: the service's loop thread's
    (its main thread) and the client's, which the poll waits for in turn, and the longest of the
    service's other threads' (one of which may hold the interpreter lock the loop needs). A loop held
    up by the service itself (the lock held for seconds) sleeps, and that wait is not counted."""
    waited = {thread: after[thread] - before[thread] for thread in after.keys() & before.keys()}
    in_turn = waited.pop(str(pid), 0.0) + waited.pop("client", 0.0)
    return in_turn + max(waited.values(), default=0.0)


def _skip_if_loaded(url: str, path: str, when: str) -> None:
    """Skip when the machine cannot hold the bound now: the slowest of many idle polls, as the
    bound is checked on the slowest poll beside the text. /metrics writes every family, some
    milliseconds of work of its own: its idle bound is wider."""
    idle = max(_seconds(url, path) for _ in range(20))
    if idle > (IDLE_BOUND if path == "/health" else HEALTH_BOUND / 2):
        pytest.skip(f"this machine answered an idle {path} in up to {idle:.3f} s {when}: too loaded to time the bound")


ATTEMPTS = 3  # a loop the text blocks misses the bound in every one; a neighbour's burst of load, in few


def _worst_beside_the_text(server, path: str, text: str, truncate: bool) -> tuple[float, float, httpx.Response]:
    """The slowest answer to `path` while `text` is embedded (or refused), the seconds its poll
    spent waiting for a CPU (`_starved`), and the text's answer."""
    answer: list[httpx.Response] = []
    body = {"inputs": text, "truncate": truncate}
    post = threading.Thread(target=lambda: answer.append(httpx.post(server.url + "/embed", json=body, timeout=120)))
    post.start()
    worst, starved = 0.0, 0.0
    polls = 0
    pid = server.process.pid
    while post.is_alive():
        before = _run_queue_seconds(pid)
        seconds = _seconds(server.url, path)
        if seconds > worst:
            worst, starved = seconds, _starved(pid, before, _run_queue_seconds(pid))
        polls += 1
    post.join()
    assert polls >= 3, f"the big request finished before {path} could be timed beside it"
    return worst, starved, answer[0]


@pytest.mark.parametrize(
    ("path", "truncate"), [("/health", True), ("/metrics", True), ("/health", False)]
)
def test_a_2_mib_text_does_not_hold_up_health_or_metrics(server, path: str, truncate: bool):
    """Embedded (truncated), or refused as too long, which counts its tokens: counted in one
    piece, that had held the interpreter lock for seconds, in every attempt. A miss is measured
    again: a machine whose load comes in bursts (another test's processes) missed it once. Misses
    that the service's threads' and this client's waits for a CPU account for are the machine's,
    and skip: with a CPU hog and another test worker on 2 cores, /health took 0.67-1.21 s in three
    attempts while idle polls, before and after, stayed under IDLE_BOUND."""
    # Short words for the refusal: a token every 3 characters (700 K of them) makes its count long.
    words = "retrieval augmented generation systems " if truncate else "ab "
    text = (words * 700_000)[: 2 * 1024 * 1024 - 256]
    worsts = []
    for _ in range(ATTEMPTS):
        _skip_if_loaded(server.url, path, "before the text")
        worst, starved, answer = _worst_beside_the_text(server, path, text, truncate)
        worsts.append((round(worst, 3), round(starved, 3)))
        if truncate:
            assert answer.status_code == 200, answer.text
            assert len(answer.json()[0]) == 384
        else:
            assert answer.status_code == 422 and "has at least" in answer.json()["error"], answer.text
        if worst <= HEALTH_BOUND:
            return
    _skip_if_loaded(server.url, path, "after the text")  # the machine may have become loaded since
    if all(worst - starved <= HEALTH_BOUND for worst, starved in worsts):
        pytest.skip(
            f"{path} took (seconds, of them waiting for a CPU) {worsts} beside the text: within the bound "
            "but for the waits of a machine whose cores were taken"
        )
    raise AssertionError(
        f"{path} took (seconds, of them waiting for a CPU) {worsts} in {ATTEMPTS} attempts beside a 2 MiB text"
    )
