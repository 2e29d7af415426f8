"""The front end's loop accepts a bounded number of connections a step.

Each accepted connection's first request is read, and a refusal answered, within the accept; with
the backlog's 4,096 accepts a step, clients that open a new connection per request (and re-ask at
once after a 429) were accepted again within the same callback, the step never ended, and the
admitted requests' answers waited behind it (bench/SERVED.md). The real loop and listening socket,
stepped one select at a time.
"""

from __future__ import annotations

import asyncio
import socket

from windve.frontend.event_loop import FrontEndLoop
from windve.frontend.slow_lane import PER_STEP


def test_a_step_accepts_no_more_connections_than_the_slow_lane_releases() -> None:
    loop = FrontEndLoop()
    made: list[asyncio.BaseTransport] = []

    class Counting(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.append(transport)

    server = loop.run_until_complete(loop.create_server(Counting, "127.0.0.1", 0, backlog=4096))
    clients: list[socket.socket] = []
    try:
        port = server.sockets[0].getsockname()[1]
        # All in the listen queue before the loop's next select.
        clients = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(3 * PER_STEP)]
        per_step = []
        while len(made) < len(clients) and len(per_step) < 1000:
            before = len(made)
            loop.call_soon(loop.stop)  # one step: a select, then the callbacks it made ready
            loop.run_forever()
            per_step.append(len(made) - before)
        assert len(made) == len(clients)
        assert per_step[0] == PER_STEP and max(per_step) == PER_STEP, per_step
    finally:
        for client in clients:
            client.close()
        for transport in made:
            transport.close()
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()
