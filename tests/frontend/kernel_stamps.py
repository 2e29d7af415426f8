"""Real TCP connections on loopback whose server side the kernel stamps (SO_TIMESTAMPNS)."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator

import pytest

from windve.frontend.arrival_stamps import stamp_arrivals


class Transport:
    """What the lane's helpers read of an asyncio transport: its socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def get_extra_info(self, name: str):
        return self.sock if name == "socket" else None


@contextlib.contextmanager
def stamped_connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A TCP connection on loopback whose server side the kernel stamps, once it does."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    server.setblocking(False)
    stamp_arrivals(Transport(server))
    with client, server:
        stamping(client, server)
        yield client, server


def stamping(client: socket.socket, server: socket.socket) -> None:
    """Until the kernel stamps what arrives: the first socket to ask turns stamping on for the
    host, and the kernel starts it from a work queue, a moment later."""
    for _ in range(500):
        client.sendall(b"-")
        select.select([server], [], [], 10)
        _, ancillary, _, _ = server.recvmsg(1, socket.CMSG_SPACE(16))
        if ancillary:
            return
        time.sleep(0.01)  # polls the kernel, which has no event to wait on
    pytest.skip("this kernel does not stamp TCP arrivals (SO_TIMESTAMPNS)")
