"""When a request's bytes reached its socket, as the kernel stamped them.

A request's time to answer, which depth control fits and holds to the SLO, begins when its bytes
were in the socket. The event loop learns of them only at its next select, and reads them only
when that step comes to their socket; a client sees both waits. Asked (SO_TIMESTAMPNS on the
connection), the kernel stamps every segment it receives, and a peek (recvmsg with MSG_PEEK) reads
the stamp of the first unread byte while leaving the bytes for the transport. TCP keeps no stamp
for a plain recv (the SIOCGSTAMPNS ioctl answers ENOENT), so the peek comes before the transport's
read: at release from the slow lane (slow_lane.py), and at each select for every ready connection
(event_loop.py). A peek costs about 0.7 us.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
from collections.abc import Iterator

# Linux's value (Python does not name it); elsewhere no stamps, and requests count from their select.
TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform.startswith("linux") else None)
_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT
_ANCILLARY = socket.CMSG_SPACE(16)  # one struct timespec


def stamp_arrivals(transport: asyncio.BaseTransport) -> None:
    """Have the kernel note when each of the connection's bytes arrived. Where it cannot (not
    Linux, not a socket), peeks find no stamp."""
    sock = transport.get_extra_info("socket")
    if TIMESTAMPNS is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, TIMESTAMPNS, 1)
    except (AttributeError, OSError):
        pass


def raw_socket(transport: asyncio.BaseTransport) -> socket.socket | None:
    """The transport's own socket object, which can recvmsg; asyncio hands out a wrapper that cannot."""
    for sock in (getattr(transport, "_sock", None), transport.get_extra_info("socket")):
        if isinstance(sock, socket.socket):
            return sock
    return None


@contextlib.contextmanager
def readable_socket(transport: asyncio.BaseTransport) -> Iterator[socket.socket | None]:
    """A socket object over the transport's descriptor that can recvmsg: its own, or one made for
    the moment and detached after, so that it never closes the descriptor."""
    own = raw_socket(transport)
    if own is not None:
        yield own
        return
    wrapper = transport.get_extra_info("socket")
    if wrapper is None:
        yield None
        return
    sock = socket.socket(wrapper.family, wrapper.type, wrapper.proto, wrapper.fileno())
    try:
        yield sock
    finally:
        sock.detach()


def peek_arrival(sock: socket.socket, size: int = 1) -> tuple[bytes, float | None]:
    """(the first `size` bytes waiting unread, empty where none wait; time.time() when the first of
    them arrived, or None where the kernel did not stamp them). Nothing is taken from the socket."""
    try:
        data, ancillary, _, _ = sock.recvmsg(size, _ANCILLARY, _PEEK)
    except OSError:  # nothing waits (EAGAIN), or the connection is gone
        return b"", None
    if not data:
        return b"", None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == TIMESTAMPNS and len(payload) >= 16:
            seconds, nanoseconds = struct.unpack("qq", payload[:16])
            return data, seconds + nanoseconds * 1e-9
    # The kernel had not begun stamping (bytes that came before the first socket asked), or cannot.
    return data, None
