"""The front end's uvicorn server, which drains on SIGTERM without leaving a connection to be reset.

uvicorn stops accepting as soon as it shuts down. A connection the kernel queues on the listening
socket after that waits unanswered, and is reset when the socket closes: at once where the server
owns the socket, but a front end of a multi-process `windve serve` shares its socket with the
parent, which holds it open to hand to a replacement. There, clients that opened a connection
just after the signal waited for the whole drain and were then reset (four clients re-asking on
new connections each lost a request that way, after 1.4 s; bench/SERVED.md).

So a draining front end keeps accepting while the connections it held at the signal finish, and
answers what comes meanwhile at once, with `connection: close`: the service is draining, so an
embedding request gets 429 "shutting down" and /health says so. Then it stops accepting, as
uvicorn does, and closes every descriptor of the socket it has: once each front end (and the
parent, windve/dispatcher/supervisor.py) has, new connections are refused at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket

import uvicorn
from uvicorn.server import ServerState

log = logging.getLogger("windve.frontend")

CLOSE_POLL = 0.05  # seconds between looks at the held connections (uvicorn's own wait polls at 0.1)


class DrainState(ServerState):
    """uvicorn's state shared by the server's connections, and whether the server drains: a
    connection made meanwhile answers with `connection: close` (http_protocol.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.draining = False


class FrontEndServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.server_state = DrainState()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.config.fd is not None:
            # uvicorn serves a duplicate of the inherited descriptor; the original would keep the
            # socket listening, unaccepted, after the server closes its own.
            os.close(self.config.fd)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state = self.server_state
        state.draining = True
        held = list(state.connections)
        log.info("draining: accepting, and answering at once, until %d open connections close", len(held))
        for connection in held:
            connection.shutdown()  # an answer under way finishes; an idle one closes soon (http_protocol.py)
        loop = asyncio.get_running_loop()
        bound = self.config.timeout_graceful_shutdown
        deadline = loop.time() + (math.inf if bound is None else bound)
        while (
            any(connection in state.connections for connection in held)
            and not self.force_exit
            and loop.time() < deadline
        ):
            await asyncio.sleep(CLOSE_POLL)  # polling the connections' set, bounded, as uvicorn's own wait does
        if bound is not None:
            # uvicorn's own wait (for what came meanwhile, and the tasks) gets what is left of the
            # bound, not a second one: the drain stays within timeout_graceful_shutdown.
            self.config.timeout_graceful_shutdown = max(0.0, deadline - loop.time())
        await super().shutdown(sockets)
