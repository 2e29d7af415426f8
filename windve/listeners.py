"""The service's listening sockets, opened before anything else starts.

`windve serve` binds its port first, in either mode: a port in use, or an address that is not this
machine's, then stops the start with one line and exit status 3 (uvicorn's for a server that
cannot listen), before a model loads or an engine process is spawned. Left to uvicorn, the
one-process mode bound after its application had started, and started the engines for nothing.

An IPv6 address (`::`, `::1`, ...) gets an IPv6 socket; `::` also takes IPv4 connections, as
uvicorn's own bind of it does on Linux (dual stack), so that one setting serves IPv6-only and
dual-stack clusters alike.
"""

from __future__ import annotations

import socket
import sys

STARTUP_FAILURE = 3  # the exit status uvicorn gives a server that cannot listen
BACKLOG = 4096  # uvicorn's setting here (windve.frontend.process.uvicorn_config)


def where(host: str, port: int) -> str:
    """host:port as a URL writes it ([::1]:8080 for IPv6)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def cannot_listen(host: str, port: int, error: OSError) -> int:
    """Say why `windve serve` cannot listen, as one line on stderr; the exit status to return."""
    print(f"windve serve: cannot listen on {where(host, port)}: {error}", file=sys.stderr)
    return STARTUP_FAILURE


def listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A socket listening on (host, port): the first address `host` resolves to; OSError if none binds."""
    addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = addresses[0]
    dual_stack = family == socket.AF_INET6 and address[0] == "::" and socket.has_dualstack_ipv6()
    return socket.create_server(
        address[:2], family=family, backlog=BACKLOG, reuse_port=reuse_port, dualstack_ipv6=dual_stack
    )


def open_listeners(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening sockets on one port, one per front end, to be inherited.

    One socket shared by every front end went, under a burst of new connections, to whichever
    process woke first: 64 connections opened at once landed 35/24/4/1 on four front ends, and
    the busiest front end set every request's pace (bench/SERVED.md). With SO_REUSEPORT the kernel
    picks a socket by the connection's addresses, evenly. A front end that dies leaves its socket
    here, so connections queued on it wait for its replacement instead of being reset.
    A plain bind goes first, so that a port already in use is an error, not a port shared with
    another service of the same user.
    """
    with listen(host, port) as plain:
        port = plain.getsockname()[1]
    listeners: list[socket.socket] = []
    try:
        for _ in range(count):
            listener = listen(host, port, reuse_port=True)
            listeners.append(listener)
            listener.set_inheritable(True)
    except BaseException:
        for listener in listeners:
            listener.close()
        raise
    return listeners
