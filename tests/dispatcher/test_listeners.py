"""The front ends' listening sockets: one each, one port, new connections spread by the kernel."""

from __future__ import annotations

import socket

import pytest

from windve.listeners import open_listeners


def _accept_all(listener: socket.socket) -> int:
    listener.setblocking(False)
    accepted = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return accepted
        conn.close()
        accepted += 1


def test_a_burst_of_connections_reaches_every_front_ends_socket() -> None:
    listeners = open_listeners("127.0.0.1", 0, 4)
    clients: list[socket.socket] = []
    try:
        port = listeners[0].getsockname()[1]
        assert {listener.getsockname()[1] for listener in listeners} == {port}
        assert all(listener.get_inheritable() for listener in listeners)
        for _ in range(64):  # opened at once, as a load generator or calibrate does
            clients.append(socket.create_connection(("127.0.0.1", port)))
        per_socket = [_accept_all(listener) for listener in listeners]
    finally:
        for sock in clients + listeners:
            sock.close()
    # Spread by a hash of the connections' addresses: a socket left with none of 64 has a chance of
    # about 4 x (3/4)^64 = 4e-8. One shared socket gave a burst like this to one or two front ends.
    assert sum(per_socket) == 64 and min(per_socket) >= 1, per_socket


def test_a_port_in_use_is_refused_not_shared() -> None:
    listeners = open_listeners("127.0.0.1", 0, 2)
    try:
        port = listeners[0].getsockname()[1]
        with pytest.raises(OSError):
            open_listeners("127.0.0.1", port, 2)
    finally:
        for listener in listeners:
            listener.close()


def _ipv6_loopback() -> bool:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="this host has no IPv6 loopback")
def test_an_ipv6_host_gets_ipv6_sockets_and_the_wildcard_takes_ipv4_too() -> None:
    """`--host ::` (an IPv6-only or dual-stack cluster) was refused with "Address family for hostname
    not supported" where the front ends' sockets were opened as IPv4 ones."""
    listeners = open_listeners("::", 0, 2)
    try:
        port = listeners[0].getsockname()[1]
        assert all(listener.family == socket.AF_INET6 for listener in listeners)
        for address in ("::1", "127.0.0.1"):  # uvicorn's own bind of "::" takes both on Linux
            socket.create_connection((address, port), timeout=5).close()
        assert sum(_accept_all(listener) for listener in listeners) == 2
    finally:
        for listener in listeners:
            listener.close()
