"""A client slow to send its body holds no room: the gate's pass lapses while the body is awaited.

Four clients that sent a head (and part of a body, or none of it) had made a service of depth 4,
its pool idle, answer 429 to every other request for as long as they kept their connections open."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.servers import read_answers, start_server


@pytest.mark.parametrize("sent", [0, 10], ids=["head only", "part of the body"])
def test_clients_slow_to_send_their_bodies_hold_no_room_and_are_answered(tmp_path, sent):
    server = start_server(tmp_path, "--cpu-depth", "4", "--depth-control", "static", "--cache-size", "0")
    slow: list[socket.socket] = []
    try:
        body = json.dumps({"inputs": "a text whose body comes in two parts"}).encode()
        head = f"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
        for _ in range(4):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            sock.sendall(head.encode() + body[:sent])
            slow.append(sock)
        # Until each slow request's handler has read its part of the body, it may hold a pass: a
        # bounded poll for the condition. Before the fix every answer here was 429.
        statuses: list[int] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and statuses[-1:] != [200]:
            statuses.append(httpx.post(server.url + "/embed", json={"inputs": "hello"}, timeout=30).status_code)
            if statuses[-1] != 200:
                time.sleep(0.05)  # polling interval of a real condition, bounded by the deadline
        assert statuses[-1:] == [200], statuses
        for sock in slow:
            sock.sendall(body[sent:])
        answers = [read_answers(sock, 1) for sock in slow]
        assert [answer[0][0] for answer in answers] == [200] * 4, answers
        assert all(len(json.loads(answer[0][2])[0]) == 384 for answer in answers)
    finally:
        for sock in slow:
            sock.close()
        server.stop()
