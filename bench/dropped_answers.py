"""Memory a front end keeps for answers its clients never take.

Starts `windve serve` (defaults: CPU, the bundled model, one process) and sends waves of large
requests (2,048 short texts, a ~9.6 MB answer; cached after the first, so the engines do little)
from clients that never read the answer:

- `reset`: each client resets its connection a few seconds after sending, before its answer is
  written or while it is (a client that times out);
- `stall`: each client keeps its connection and reads nothing (a client that hung); a wave lasts
  long enough for the send bound (30 s without a byte taken) to close them.

Prints, after each wave, the resident memory of the serving process and of its children (engine
processes), and the connections the server still holds.

    python bench/dropped_answers.py [--mode reset|stall] [--waves 5] [--clients 30] [--port 18620]
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.served import start, stop  # noqa: E402


def resident_mib(process: psutil.Process) -> dict[str, int]:
    sizes = {"serve": process.memory_info().rss >> 20}
    for index, child in enumerate(process.children(recursive=True)):
        sizes[f"child{index}"] = child.memory_info().rss >> 20
    return sizes


def held_connections(port: int) -> int:
    connections = psutil.net_connections("tcp")
    return sum(1 for c in connections if c.laddr and c.laddr.port == port and c.status == "ESTABLISHED")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("reset", "stall"), default="reset")
    parser.add_argument("--waves", type=int, default=5)
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--port", type=int, default=18620)
    args = parser.parse_args()
    body = json.dumps({"inputs": [f"text number {i % 64}" for i in range(2048)]}).encode()
    head = (f"POST /embed HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    command = [sys.executable, "-m", "windve.commands.serve", "--host", "127.0.0.1", "--port", str(args.port)]
    server = start(command, args.port, "/health", {"HF_HUB_OFFLINE": "1"}, "windve-dropped")
    try:
        process = psutil.Process(server.pid)
        answer = httpx.post(f"http://127.0.0.1:{args.port}/embed", content=body, timeout=300)
        print(f"answer {len(answer.content):,} bytes; before: {resident_mib(process)} MiB", flush=True)
        held: list[socket.socket] = []
        for wave in range(1, args.waves + 1):
            clients = []
            for _ in range(args.clients):
                client = socket.socket()
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                client.connect(("127.0.0.1", args.port))
                client.sendall(head + body)
                clients.append(client)
            if args.mode == "reset":
                time.sleep(3)  # the clients' own timeout
                for client in clients:
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.close()  # with SO_LINGER 0: a reset
                time.sleep(20)  # the server answers the dropped requests meanwhile
            else:
                held += clients
                time.sleep(70)  # past the 30 s send bound, twice: a first check may see the window fill
            print(f"after wave {wave}: {resident_mib(process)} MiB, connections held {held_connections(args.port)}",
                  flush=True)
        for client in held:
            client.close()
    finally:
        stop(server)


if __name__ == "__main__":
    main()
