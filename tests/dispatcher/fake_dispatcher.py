"""The dispatcher's end of the hop for tests of what a front end sends and reads: a real listening
Unix socket, and one RemoteDispatcher connected to it."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from windve.dispatcher.client import RemoteDispatcher
from windve.dispatcher.link import FrameLink


@contextlib.asynccontextmanager
async def connected_front_end(
    address: str, board: Path, on_message: Callable[[list[bytes]], None] = lambda frames: None
) -> AsyncIterator[tuple[RemoteDispatcher, FrameLink]]:
    """(the started front end, the dispatcher's side of its connection, which hands each message
    to `on_message`); both closed on exit."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(address)
        listener.listen()
        front_end = RemoteDispatcher(address, board)
        front_end.start()
        dispatcher = FrameLink(listener.accept()[0], on_message)
        dispatcher.start()
        try:
            yield front_end, dispatcher
        finally:
            await front_end.close()
            dispatcher.close()
