"""The front end -> dispatcher hop's transport, chosen by measurement: ZMQ against a shared-memory
ring and a Unix socket, the same messages, in one run.

Each transport carries what the hop carries: an embed request of one 75-token text (the msgpack
frame of windve.dispatcher.messages, ~0.4 KB) one way and its 384-float answer (~1.6 KB) back,
between two processes that each run an asyncio loop, as a front end and the dispatcher do. The
server side unpacks each request and packs its answer, so every transport pays the same codec.

- `zmq`: DEALER -> ROUTER over ipc (pyzmq, which locust brings), each socket's descriptor watched
  by the loop and every waiting message read with NOBLOCK, as WindVE's hop did until 2026-11-28
  (ZMQ's own I/O thread does the socket writes and reads).
- `shm`: two single-producer single-consumer byte rings in a shared mapping (head and tail
  counters on their own cache lines, length-prefixed records), and an eventfd per direction
  that the loop watches. A sender writes its records, then wakes the reader with one eventfd
  write per loop turn, however many records it wrote in the turn. The wake-up is not skipped
  when the reader is busy: knowing that it is parked needs a store-load fence between "parked"
  and "ring empty" on both sides, which Python does not have, and without it a wake-up is lost.
- `unix`: windve.dispatcher.link.FrameLink over a socketpair, what WindVE runs: length-prefixed
  frames, one send() per loop turn.

Printed per transport and round: the round trip of one request at a time (median and p99), the
requests per second with 64 in flight, and the CPU per request of each side at 64 in flight
(/proc: every thread, ZMQ's I/O thread included). Rounds alternate the transports, each in a
fresh pair of processes.

    python bench/transport.py [--requests 20000] [--rounds 3] [--transports zmq,shm,unix]
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import multiprocessing
import os
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from windve.dispatcher import messages  # noqa: E402
from windve.engine_process.usage import process_usage  # noqa: E402

DIM = 384
IN_FLIGHT = 64
RING_BYTES = 1 << 20
OnMessage = Callable[[bytes], None]


class Ring:
    """One direction of the shared-memory link: the writer owns `tail`, the reader owns `head`.

    Records are a u32 length and the payload, padded to 8 bytes; a record that would run past the
    end leaves a wrap marker and starts again at offset 0. x86 keeps stores in order and loads in
    order, which is all this needs; an ARM host (Kunpeng, beside Ascend NPUs) would need fences."""

    HEAD, TAIL, DATA = 0, 64, 128
    WRAP = 0xFFFFFFFF

    def __init__(self, size: int = RING_BYTES) -> None:
        self.size = size
        self.buf = mmap.mmap(-1, self.DATA + size)  # anonymous and shared: inherited over fork
        self._tail = self._head = 0

    def put(self, payload: bytes) -> None:
        length = len(payload)
        need = (4 + length + 7) & ~7
        head = struct.unpack_from("<Q", self.buf, self.HEAD)[0]
        pos = self._tail % self.size
        skip = self.size - pos if pos + need > self.size else 0
        if self._tail + skip + need - head > self.size:
            raise BufferError("ring full")  # the bench keeps 64 in flight in a 1 MiB ring
        if skip:
            struct.pack_into("<I", self.buf, self.DATA + pos, self.WRAP)
            self._tail += skip
            pos = 0
        start = self.DATA + pos
        struct.pack_into("<I", self.buf, start, length)
        self.buf[start + 4 : start + 4 + length] = payload
        self._tail += need
        struct.pack_into("<Q", self.buf, self.TAIL, self._tail)

    def take(self) -> list[bytes]:
        tail = struct.unpack_from("<Q", self.buf, self.TAIL)[0]
        out = []
        while self._head != tail:
            pos = self._head % self.size
            length = struct.unpack_from("<I", self.buf, self.DATA + pos)[0]
            if length == self.WRAP:
                self._head += self.size - pos
                continue
            start = self.DATA + pos + 4
            out.append(self.buf[start : start + length])
            self._head += (4 + length + 7) & ~7
        struct.pack_into("<Q", self.buf, self.HEAD, self._head)
        return out


class ShmLink:
    def __init__(self, tx: Ring, tx_fd: int, rx: Ring, rx_fd: int) -> None:
        self.tx, self.tx_fd, self.rx, self.rx_fd = tx, tx_fd, rx, rx_fd
        self._wake_queued = False

    def start(self, on_message: OnMessage) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_message = on_message
        self._loop.add_reader(self.rx_fd, self._readable)
        self._readable()

    def close(self) -> None:
        self._loop.remove_reader(self.rx_fd)
        os.close(self.rx_fd)
        os.close(self.tx_fd)

    def send(self, payload: bytes) -> None:
        self.tx.put(payload)
        if not self._wake_queued:
            self._wake_queued = True
            self._loop.call_soon(self._wake)

    def _wake(self) -> None:
        self._wake_queued = False
        os.eventfd_write(self.tx_fd, 1)

    def _readable(self) -> None:
        try:
            os.eventfd_read(self.rx_fd)
        except BlockingIOError:
            pass
        for payload in self.rx.take():
            self._on_message(payload)


class UnixLink:
    """WindVE's link, with the bench's one-payload interface."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def start(self, on_message: OnMessage) -> None:
        from windve.dispatcher.link import FrameLink

        self._link = FrameLink(self.sock, lambda frames: on_message(frames[0]))
        self._link.start()

    def send(self, payload: bytes) -> None:
        self._link.send([payload])

    def close(self) -> None:
        self._link.close()


class ZmqLink:
    """One end of a DEALER/ROUTER pair over ipc; the server side answers each sender."""

    def __init__(self, address: str, server: bool) -> None:
        self.address, self.server = address, server

    def start(self, on_message: OnMessage) -> None:
        import zmq

        self._zmq = zmq
        self._context = zmq.Context()
        self._socket = sock = self._context.socket(zmq.ROUTER if self.server else zmq.DEALER)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        if self.server:
            sock.bind(self.address)
        else:
            sock.connect(self.address)
        self._peer = b""
        self._on_message = on_message
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.getsockopt(zmq.FD), self._read)
        self._loop.call_soon(self._read)

    def _read(self) -> None:
        zmq = self._zmq
        # ZMQ's descriptor is edge-triggered: read everything that waits.
        while self._socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frames = self._socket.recv_multipart(zmq.NOBLOCK)
            if self.server:
                self._peer = frames[0]
            self._on_message(frames[-1])

    def close(self) -> None:
        self._loop.remove_reader(self._socket.getsockopt(self._zmq.FD))
        self._socket.close(0)
        self._context.term()  # a context collected with a socket open would block in term()

    def send(self, payload: bytes) -> None:
        zmq = self._zmq
        self._socket.send_multipart([self._peer, payload] if self.server else [payload], flags=zmq.NOBLOCK)
        if self._socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # a send can take in messages silently
            self._loop.call_soon(self._read)


def _request(number: int) -> bytes:
    lengths, ids = messages.pack_sequences([np.arange(1, 76, dtype=np.int32)])
    return messages.pack({"op": messages.EMBED, "id": number, "lengths": lengths, "ids": ids})


def _serve(make_link: Callable[[], object], ready) -> None:
    vectors = np.zeros(DIM, dtype=np.float32).tobytes()

    async def main() -> None:
        link = make_link()

        def answer(payload: bytes) -> None:
            request = messages.unpack(payload)
            messages.unpack_sequences(request["lengths"], request["ids"])
            link.send(messages.pack({"id": request["id"], "status": messages.OK, "vectors": vectors}))

        link.start(answer)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


async def _drive(link, requests: int, in_flight: int) -> tuple[float, list[float]]:
    """Send `requests` keeping `in_flight` outstanding; (seconds, round trips when one at a time)."""
    done = asyncio.get_running_loop().create_future()
    sent = answered = 0
    stamps: dict[int, float] = {}
    trips: list[float] = []

    def send_next() -> None:
        nonlocal sent
        stamps[sent] = time.perf_counter()
        link.send(_request(sent))
        sent += 1

    def received(payload: bytes) -> None:
        nonlocal answered
        number = messages.unpack(payload)["id"]
        trips.append(time.perf_counter() - stamps.pop(number))
        answered += 1
        if sent < requests:
            send_next()
        elif answered == requests and not done.done():
            done.set_result(None)

    link.start(received)
    await asyncio.sleep(0.2)  # ZMQ connects in the background; the others are ready at once
    started = time.perf_counter()
    for _ in range(min(in_flight, requests)):
        send_next()
    await done
    seconds = time.perf_counter() - started
    link.close()
    return seconds, trips


def _measure(name: str, requests: int, folder: Path) -> dict[str, float]:
    context = multiprocessing.get_context("fork")  # the rings and descriptors are inherited
    results: dict[str, float] = {}
    for in_flight in (1, IN_FLIGHT):
        if name == "shm":
            up, down = Ring(), Ring()
            up_fd, down_fd = os.eventfd(0, os.EFD_NONBLOCK), os.eventfd(0, os.EFD_NONBLOCK)
            client = ShmLink(up, up_fd, down, down_fd)

            def server_link(up=up, up_fd=up_fd, down=down, down_fd=down_fd) -> ShmLink:
                return ShmLink(down, down_fd, up, up_fd)
        elif name == "unix":
            near, far = socket.socketpair()
            client = UnixLink(near)

            def server_link(far=far) -> UnixLink:
                return UnixLink(far)
        else:
            address = f"ipc://{folder}/hop-{in_flight}"
            client = ZmqLink(address, server=False)

            def server_link(address=address) -> ZmqLink:
                return ZmqLink(address, server=True)

        ready = context.Event()
        child = context.Process(target=_serve, args=(server_link, ready), daemon=True)
        child.start()
        ready.wait(30)
        try:
            own, server = time.process_time(), process_usage(child.pid)[1]
            seconds, trips = asyncio.run(_drive(client, requests, in_flight))
            own_us = (time.process_time() - own) / requests * 1e6
            server_us = (process_usage(child.pid)[1] - server) / requests * 1e6
        finally:
            child.kill()
            child.join()
        if in_flight == 1:
            results["median_us"] = statistics.median(trips) * 1e6
            results["p99_us"] = sorted(trips)[int(0.99 * len(trips))] * 1e6
        else:
            results["rate"] = requests / seconds
            results["client_us"], results["server_us"] = own_us, server_us
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transports", default="zmq,shm,unix")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="windve-transport-"))
    names = args.transports.split(",")
    print(f"{args.requests} one-text requests a level; round trip one at a time, rate and CPU at {IN_FLIGHT} in flight")
    print(
        f"{'round':<6} {'transport':<10} {'median us':>10} {'p99 us':>8} {'req/s':>8}"
        f" {'client CPU us':>14} {'server CPU us':>14}"
    )
    for round_number in range(1, args.rounds + 1):
        order = names if round_number % 2 else names[::-1]
        for name in order:
            r = _measure(name, args.requests, folder)
            print(
                f"{round_number:<6} {name:<10} {r['median_us']:>10.1f} {r['p99_us']:>8.1f} {r['rate']:>8.0f}"
                f" {r['client_us']:>14.1f} {r['server_us']:>14.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
