"""A Unix socket in a folder deeper than a socket address holds: bound and connected all the same."""

from __future__ import annotations

import socket
import stat

from windve.dispatcher.unix_path import MAX_PATH_BYTES, reachable


def test_a_short_path_is_its_own_address(tmp_path):
    path = str(tmp_path / "d.sock")
    assert len(path) <= MAX_PATH_BYTES
    with reachable(path) as address:
        assert address == path


def test_a_socket_past_the_address_limit_binds_and_connects_in_its_own_folder(tmp_path):
    folder = tmp_path / ("deep-" + "x" * 100)
    folder.mkdir()
    path = folder / "dispatcher.sock"
    assert len(str(path)) > MAX_PATH_BYTES
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        with reachable(str(path)) as address:
            listener.bind(address)
        listener.listen(1)
        assert stat.S_ISSOCK(path.stat().st_mode)  # the socket is the file at the path asked for
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            with reachable(str(path)) as address:
                client.connect(address)
            served, _ = listener.accept()
            with served:
                client.sendall(b"ping")
                assert served.recv(4) == b"ping"
