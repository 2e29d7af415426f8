"""What clients see when `windve serve` gets SIGTERM under load.

Starts `windve serve` (the bundled model unless --model; --http-workers front ends), runs
--clients threads that each post one text at a time, every request on a new connection (as a
client behind a connection-per-request proxy does), sends SIGTERM --before seconds in, and
keeps the clients going until a second after the service exited. Prints how long the exit took
and, for the requests sent after the signal, how each ended (status code or httpx error) and
how long it took, split into before and after the exit. A client backs off half a second
after a refused connection, as a client with retries does: spinning on refusals would take the
cores the engines stop on.

    python bench/drain.py [--http-workers 2] [--clients 4] [--before 3] [--model DIR]

Reset connections show as ReadError (or RemoteProtocolError), and their time is how long the
client waited for nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx

TEXT = "a sentence about retrieval augmented generation and embeddings " * 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--http-workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--before", type=float, default=3.0, help="seconds of load before SIGTERM")
    parser.add_argument("--model", default=None)
    args = parser.parse_args()

    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "windve.cli",
        "serve",
        "--port",
        str(port),
        "--cache-size",
        "0",
        "--http-workers",
        str(args.http_workers),
    ] + (["--model", args.model] if args.model else [])
    log = tempfile.NamedTemporaryFile(prefix="windve-drain-", suffix=".log", delete=False)
    service = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and service.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)  # polling the service's start, bounded
    else:
        service.kill()
        sys.exit(f"the service did not become healthy; its log: {log.name}")

    stop = threading.Event()
    results: list[tuple[float, float, str]] = []  # (sent, seconds, outcome)

    def client() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            refused = False
            try:
                outcome = str(httpx.post(url + "/embed", json={"inputs": [TEXT]}, timeout=60).status_code)
            except httpx.HTTPError as error:
                outcome = type(error).__name__
                refused = isinstance(error, httpx.ConnectError)
            results.append((sent, time.monotonic() - sent, outcome))
            if refused:
                time.sleep(0.5)  # a client's back-off after a refused connection

    threads = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    time.sleep(args.before)  # load before the signal, by design
    signalled = time.monotonic()
    service.send_signal(signal.SIGTERM)
    code = service.wait(120)
    exited = time.monotonic() - signalled
    time.sleep(1.0)  # clients meet the closed port for a second, by design
    stop.set()
    for thread in threads:
        thread.join(70)

    before = sum(1 for sent, _, _ in results if sent < signalled)
    print(
        f"{args.http_workers} front end(s), {args.clients} clients: exit code {code} {exited:.2f} s after SIGTERM; "
        f"{before} requests before it"
    )
    outcomes: dict[tuple[bool, str], list[float]] = collections.defaultdict(list)
    for sent, seconds, outcome in results:
        if sent >= signalled:
            outcomes[(sent - signalled >= exited, outcome)].append(seconds)
    for (after_exit, outcome), times in sorted(outcomes.items()):
        times.sort()
        print(
            f"  {'after the exit' if after_exit else 'while draining'} {outcome:>20}: {len(times):4d}, "
            f"median {times[len(times) // 2]:.3f} s, slowest {times[-1]:.3f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
