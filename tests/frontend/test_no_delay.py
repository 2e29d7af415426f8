"""Every accepted connection gets TCP_NODELAY, however its listening socket reached uvicorn.

Without it an answer, written as its head and then its body, waited for the client's delayed ACK of
the head: a kept-alive client's second and later requests took ~44 ms against ~1 ms (bench/SERVED.md).
asyncio sets the option only on sockets it knows for TCP; neither way `windve serve` hands uvicorn
its socket (a descriptor in a front end, a socket from windve/listeners.py in one process) is one."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn

from windve.frontend.http_protocol import JsonErrorHttpToolsProtocol
from windve.listeners import listen


class NoDelaySeen(JsonErrorHttpToolsProtocol):
    seen: list[int] = []

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        NoDelaySeen.seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


async def app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("handed", ["fd", "sockets"])
def test_accepted_connections_do_not_wait_for_the_clients_ack(handed):
    listener = listen("127.0.0.1", 0)
    port = listener.getsockname()[1]
    where = {"fd": listener.fileno()} if handed == "fd" else {}
    loop = "windve.frontend.event_loop:new_event_loop"  # the service's (uvloop sets the option itself)
    config = uvicorn.Config(app, http=NoDelaySeen, loop=loop, lifespan="off", log_level="warning", **where)
    server = uvicorn.Server(config)
    run = (lambda: server.run(sockets=[listener])) if handed == "sockets" else server.run
    thread = threading.Thread(target=run, daemon=True)
    NoDelaySeen.seen.clear()
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        threading.Event().wait(0.01)  # uvicorn offers no start event to wait on
    try:
        assert server.started
        with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
            client.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert client.recv(1024).startswith(b"HTTP/1.1 200")
        assert NoDelaySeen.seen and all(NoDelaySeen.seen), NoDelaySeen.seen
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()
