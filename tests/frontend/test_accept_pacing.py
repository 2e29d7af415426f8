"""The front end's loop accepts, in a step, the connections that were waiting when it began.

Each accepted connection's first request is read, and a refusal answered, within the accept; with
the backlog's 4,096 accepts a step, clients that open a new connection per request (and re-ask at
once after a 429) were accepted again within the same callback, the step never ended, and the
admitted requests' answers waited behind it. A fixed 64 a step cured that but left a burst of
1,530 new clients' first requests waiting 24 long steps, past the SLO (bench/SERVED.md). The
real loop and listening socket, stepped one select at a time.
"""

from __future__ import annotations

import asyncio
import socket

from windve.frontend.event_loop import FrontEndLoop

WAITING = 150  # over the fixed 64 a step tried before


def test_a_step_accepts_those_waiting_at_its_start_and_those_that_came_meanwhile_in_the_next() -> None:
    loop = FrontEndLoop()
    made: list[asyncio.BaseTransport] = []
    clients: list[socket.socket] = []

    class Reconnecting(asyncio.Protocol):
        """Each connection accepted makes a client connect again, as one refused and re-asking
        on a new connection does, up to three rounds' worth."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.append(transport)
            if len(clients) < 3 * WAITING:
                clients.append(socket.create_connection(("127.0.0.1", port), timeout=30))

    server = loop.run_until_complete(loop.create_server(Reconnecting, "127.0.0.1", 0, backlog=4096))
    try:
        port = server.sockets[0].getsockname()[1]
        clients.extend(socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(WAITING))
        per_step = []
        while len(made) < 3 * WAITING and len(per_step) < 1000:
            before = len(made)
            loop.call_soon(loop.stop)  # one step: a select, then the callbacks it made ready
            loop.run_forever()
            per_step.append(len(made) - before)
        # A burst waiting at once is accepted in one step; who came during it, in the next.
        assert per_step[:3] == [WAITING] * 3, per_step
    finally:
        for client in clients:
            client.close()
        for transport in made:
            transport.close()
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()
