"""The front ends' listening sockets: one each, one port, new connections spread by the kernel."""

from __future__ import annotations

import socket

import pytest

from windve.dispatcher.supervisor import open_listeners


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
