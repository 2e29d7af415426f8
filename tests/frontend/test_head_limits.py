"""A request's head is bounded in size (431) and in the time it takes to come (408, or a silent
close for a connection that sent nothing), as hyper and nginx bound it; uvicorn's httptools
protocol read a header that never ended for as long as it came, and kept a connection that sent
part of a head, or nothing, open for ever."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.frontend.test_early_refusal import BODY, RecordingApp, post
from tests.servers import read_answers, uvicorn_in_thread
from windve.frontend import head_limits
from windve.frontend.gate import OverloadGate
from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol


@pytest.fixture
def served(monkeypatch):
    monkeypatch.setattr(head_limits, "HEAD_SECONDS", 0.5)
    monkeypatch.setattr(head_limits, "BODY_IDLE_SECONDS", 0.5)
    app = RecordingApp()
    app.dispatcher.full = None  # room
    with uvicorn_in_thread(OverloadGate(app), http=JsonErrorHttpToolsProtocol, loop="asyncio") as (_, port):
        yield app, port


def test_a_head_over_the_limit_is_431_and_the_connection_closed(served):
    app, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(b"POST /embed HTTP/1.1\r\nHost: t\r\nX-Long: ")
        with pytest.raises(OSError):  # the server closes once it has answered, while this still sends
            for _ in range(64):  # up to 4 MiB of one header value that never ends
                client.sendall(b"a" * 65536)
        answers = read_answers(client, 1)
    assert [status for status, _, _ in answers] == [431], answers
    assert "exceed" in json.loads(answers[0][2])["error"]
    assert app.seen == []


@pytest.mark.parametrize(
    "headers",
    [b"X-Long: " + b"a" * 70_000 + b"\r\n", b"".join(b"X-%d: %s\r\n" % (i, b"b" * 56) for i in range(1_800))],
    ids=["one long header", "many headers"],
)
def test_a_head_over_the_limit_that_comes_whole_is_431_too(served, headers):
    """Counted by reads from the one after a head's first, a head sent in one read passed the
    limit by up to a read (70 KB in one header, 111 KB in 1,800, were served)."""
    app, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(b"POST /embed HTTP/1.1\r\nHost: t\r\n" + headers + b"Content-Length: %d\r\n\r\n" % len(BODY)
                       + BODY)
        answers = read_answers(client, 1)
        assert client.recv(1) == b""  # closed
    assert [status for status, _, _ in answers] == [431], answers
    assert app.seen == []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:  # 64 KiB exactly is served
        # Counted as the target and each header's name, value, ": " and CRLF.
        length = str(len(BODY)).encode()
        padding = head_limits.MAX_HEAD_BYTES - len(b"/embed") - (4 + 1 + 4) - (5 + 4) - (14 + len(length) + 4)
        for extra, status in ((0, 200), (1, 431)):
            client.sendall(b"POST /embed HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"c" * (padding + extra) + b"\r\n"
                           + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
            assert [answer[0] for answer in read_answers(client, 1)] == [status]


def test_a_head_that_stops_coming_is_408_and_a_silent_connection_is_closed(served):
    app, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as partial:
        partial.sendall(b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Le")
        answers = read_answers(partial, 1)  # the server answers, then closes
        assert partial.recv(1) == b""
    assert [status for status, _, _ in answers] == [408], answers
    with socket.create_connection(("127.0.0.1", port), timeout=30) as silent:
        assert silent.recv(1) == b""  # closed with no answer: it asked nothing
    assert app.seen == []


def test_a_body_that_stops_coming_is_408_and_one_that_keeps_coming_is_served(served):
    """A head and part of a body, then nothing: held unanswered for as long as the client kept the
    connection (1,000 such held 1,000 descriptors past a minute). A slow body is not a stalled one."""
    app, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as stalled:
        stalled.sendall(post("/embed", BODY)[:-3])
        answers = read_answers(stalled, 1)
        assert stalled.recv(1) == b""
    assert [status for status, _, _ in answers] == [408], answers
    assert "body stopped arriving" in json.loads(answers[0][2])["error"]
    request = post("/embed", BODY)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
        head_end = request.index(b"\r\n\r\n") + 4
        slow.sendall(request[:head_end])
        for offset in range(head_end, len(request)):  # a client's pace, not a wait for the server
            time.sleep(0.1)  # a byte every 0.1 s: 2 s in all, well past 0.5 s
            slow.sendall(request[offset : offset + 1])
        answers = read_answers(slow, 1)
    assert [status for status, _, _ in answers] == [200], answers


def test_heads_within_bounds_and_pipelined_bodies_are_served(served):
    app, port = served
    big = json.dumps({"inputs": "x" * 200_000}).encode()  # bodies are not heads: a pipeline of large ones
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(post("/embed", big) + post("/embed", big) + post("/embed", BODY))
        answers = read_answers(client, 3)
    assert [status for status, _, _ in answers] == [200, 200, 200], answers


MALFORMED_HEADER = b"POST /embed HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n"  # a space in a header name


@pytest.mark.parametrize(
    ("tail", "status"),
    [
        (MALFORMED_HEADER, 400),
        (b"POST /embed HTTP/1.1\r\nHost: t\r\nX-Long: " + b"a" * 70_000 + b"\r\nContent-Length: 0\r\n\r\n", 431),
        (b"POST /embed HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),  # a bad chunk size
    ],
    ids=["malformed head", "head over the limit", "malformed body"],
)
def test_requests_pipelined_before_a_refused_one_get_their_answers_first(served, tail, status):
    """Valid requests, then one the server must refuse and close on, written at once: uvicorn wrote
    the refusal and closed while the valid ones were still being answered, and their answers were lost."""
    app, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(post("/embed", BODY) * 2 + tail)
        answers = read_answers(client, 3)
        assert client.recv(1) == b""  # closed after the refusal
    assert [answer[0] for answer in answers] == [200, 200, status], answers
    assert answers[1][1].get("connection") != "close" and answers[2][1]["connection"] == "close"
    assert app.seen == ["/embed", "/embed"]  # the refused one never reached the app


def test_a_refused_request_alone_is_answered_and_closed_at_once(served):
    app, port = served
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(MALFORMED_HEADER)
        answers = read_answers(client, 1)
        assert client.recv(1) == b""
    assert [answer[0] for answer in answers] == [400], answers
    assert "malformed HTTP request" in json.loads(answers[0][2])["error"]
    assert app.seen == []
