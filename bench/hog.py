"""Adaptive depth control under a CPU hog: does the accepted p99 return under the SLO?

Starts `windve serve` (defaults: adaptive depth control, warm-up probe), drives a closed loop
of C clients (C = the probed depth x --load, re-asking at once after every answer, 429s
included), starts a busy-loop process that takes one core `--hog-at` seconds in, stops it
`--hog-for` seconds later, and prints one line a second: the pool's depth, answers and 200s
per second, the p99 of the 200s answered in the last two seconds as this client timed them, the
share of the service's 200s over the SLO in the same two seconds (its /metrics, every 200 timed
from its bytes' arrival to its answer) and the p99 of this client's own event-loop lateness (a
10-ms timer): the client shares the cores with the hog too, and its lateness is in its timings.
Then a summary:
- how long after the hog started the accepted p99 came back under the SLO (and stayed), by the
  client's timings and by the service's (at most 1 % of its 200s over the SLO);
- how long after the hog ended the depth was back to >= 80 % of its value before;
- the p99 of every 200 answered from 10 s after the hog started to its end, and how many were over
  the SLO: one figure over thousands of answers, where a two-second window holds several hundred
  (about 800-900 on 2 cores) and its p99 is about their ninth slowest;
- the service's depth moves (from its log), and how many rises a fall undid within 3 s.

    python bench/hog.py [--seconds 90] [--hog-at 20] [--hog-for 30] [--load 1.0] [--slo 1.0]

The client is asyncio on raw sockets in this process, sharing the machine's cores with the
service (say so when quoting figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.time_split import snapshot, split  # noqa: E402
from tests.servers import free_port  # noqa: E402

LAG_TICK = 0.01  # seconds between the client's lateness samples

BODY = json.dumps({"inputs": "How does a retrieval pipeline decide which passages answer a question? " * 5})


async def client(port: int, stop: asyncio.Event, answers: list[tuple[float, float, int]]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        f"POST /embed HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
        + BODY
    ).encode()
    while not stop.is_set():
        started = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        finished = time.perf_counter()
        answers.append((finished, finished - started, status))
    writer.close()


async def loop_lag(stop: asyncio.Event, lags: list[tuple[float, float]]) -> None:
    """How late this process's event loop runs a timer: what it adds to every latency it takes."""
    while not stop.is_set():
        due = time.perf_counter() + LAG_TICK
        await asyncio.sleep(LAG_TICK)
        now = time.perf_counter()
        lags.append((now, now - due))


def over_share(before, after) -> float | None:
    """The share of the service's 200s between two /metrics snapshots that were over the SLO's bound."""
    over = split(before, after).get("over_slo")  # (over, answered, bound); absent when none was answered
    return over[0] / over[1] if over else None


def depth_of(url: str) -> tuple[int, float | None]:
    """The total depth, and the worst of the pools' own live p99 (depth control's, over its tail window)."""
    pools = httpx.get(url + "/info", timeout=10).json()["pools"]
    tails = [pool["control"].get("live_p99") for pool in pools if pool.get("control")]
    tails = [tail for tail in tails if tail is not None]
    return sum(pool["depth"] for pool in pools), (max(tails) if tails else None)


async def run(args: argparse.Namespace) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(Path(tempfile.gettempdir()) / f"hog-{port}.log", "wb")
    env = os.environ | {"HF_HUB_OFFLINE": "1", "WINDVE_CACHE_SIZE": "0", "WINDVE_SLO_SECONDS": str(args.slo)}
    command = [sys.executable, "-m", "windve.commands.serve", "--port", str(port)]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    hog = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)  # polling the server's start, bounded by the deadline
        seed, _ = depth_of(url)
        clients = max(1, round(seed * args.load))
        hog_window = f"{args.hog_at:g}-{args.hog_at + args.hog_for:g} s"
        print(f"probed depth {seed}; {clients} clients; SLO {args.slo} s; hog at {hog_window}")
        stop = asyncio.Event()
        answers: list[tuple[float, float, int]] = []
        lags: list[tuple[float, float]] = []
        tasks = [asyncio.create_task(client(port, stop, answers)) for _ in range(clients)]
        tasks.append(asyncio.create_task(loop_lag(stop, lags)))
        start, wall_start = time.perf_counter(), time.time()
        depths: list[tuple[float, int]] = []
        snapshots = [await asyncio.to_thread(snapshot, port, args.slo)]
        shares: list[tuple[int, float | None]] = []  # (second, the service's share over the SLO in 2 s)
        print(f"{'t':>4} {'depth':>6} {'ans/s':>7} {'200/s':>7} {'p99 200s (2 s)':>15} {'service p99 (5 s)':>18}"
              f" {'service >SLO (2 s)':>19} {'client lag p99':>15}")
        for second in range(1, args.seconds + 1):
            await asyncio.sleep(max(0.0, start + second - time.perf_counter()))  # the report's clock
            now = time.perf_counter() - start
            if hog is None and now >= args.hog_at and now < args.hog_at + args.hog_for:
                hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
            if hog is not None and hog.poll() is None and now >= args.hog_at + args.hog_for:
                hog.kill()
            depth, service_p99 = await asyncio.to_thread(depth_of, url)
            depths.append((now, depth))
            snapshots.append(await asyncio.to_thread(snapshot, port, args.slo))
            share = over_share(snapshots[max(0, len(snapshots) - 3)], snapshots[-1])
            shares.append((second, share))
            late_by = [lag for at, lag in lags if at - start > now - 2]
            last = [a for a in answers if a[0] - start > now - 1]
            window = [a[1] for a in answers if a[0] - start > now - 2 and a[2] == 200]
            p99 = float(np.percentile(window, 99)) if window else float("nan")
            ok = sum(1 for a in last if a[2] == 200)
            own = "-" if service_p99 is None else f"{service_p99:.3f}"
            over = "-" if share is None else f"{100 * share:.2f} %"
            lag = f"{1000 * np.percentile(late_by, 99):.0f} ms" if late_by else "-"
            print(f"{second:>4} {depth:>6} {len(last):>7} {ok:>7} {p99:>15.3f} {own:>18} {over:>19} {lag:>15}",
                  flush=True)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        summarize(answers, depths, start, args)
        summarize_service(shares, lags, start, args)
        summarize_moves(Path(log.name).read_text(errors="replace"), wall_start)
    finally:
        if hog is not None and hog.poll() is None:
            hog.kill()
        server.terminate()
        server.wait(60)


def summarize(answers, depths, start, args) -> None:
    hog_start, hog_end = args.hog_at, args.hog_at + args.hog_for
    before = [d for t, d in depths if hog_start - 5 <= t < hog_start]
    reference = float(np.median(before)) if before else float("nan")
    # The first second after which every later two-second window of the hog stays under the SLO.
    settled = None
    for second in range(int(hog_start) + 1, int(hog_end) + 1):
        windows_ok = True
        for later in range(second, int(hog_end) + 1):
            window = [a[1] for a in answers if later - 2 < a[0] - start <= later and a[2] == 200]
            if window and np.percentile(window, 99) > args.slo:
                windows_ok = False
                break
        if windows_ok:
            settled = second - hog_start
            break
    recovered = next((t - hog_end for t, d in depths if t >= hog_end and d >= 0.8 * reference), None)
    ok = [a for a in answers if a[2] == 200]
    lowest = min(d for t, d in depths if hog_start <= t < hog_end)
    print(f"depth before the hog: {reference:.0f}; lowest during it: {lowest}")
    print(f"accepted p99 back under {args.slo} s for good: {settled} s after the hog started" if settled is not None
          else "accepted p99 did not settle under the SLO while the hog ran")
    print(f"depth back to >= 80 % of before: {recovered:.0f} s after the hog ended" if recovered is not None
          else "depth did not come back to 80 % of before")
    late = [a[1] for a in answers if hog_start + 10 < a[0] - start <= hog_end and a[2] == 200]
    if late:
        over = sum(1 for seconds in late if seconds > args.slo)
        print(f"200s from 10 s after the hog started to its end: {len(late)}, p99 {np.percentile(late, 99):.3f} s, "
              f"{over} over the SLO ({100 * over / len(late):.2f} %)")
    print(f"overall: {len(answers)} answers, {len(ok)} 200s, {len(answers) - len(ok)} others")


def summarize_service(shares: list[tuple[int, float | None]], lags: list[tuple[float, float]], start: float,
                      args: argparse.Namespace) -> None:
    """The same question as summarize's first, asked of the service's own timings; and the client's lag."""
    hog_start, hog_end = args.hog_at, args.hog_at + args.hog_for
    during = [(second, share) for second, share in shares if hog_start < second <= hog_end]
    settled = next(
        (second - hog_start for i, (second, _) in enumerate(during)
         if all(share is None or share <= 0.01 for _, share in during[i:])),
        None,
    )
    print(f"the service's 200s: at most 1 % over {args.slo} s in every later two-second window from "
          f"{settled:.0f} s after the hog started" if settled is not None
          else "the service's 200s: over 1 % above the SLO in the hog's last two-second window")
    for name, lo, hi in (("before the hog", 0, hog_start), ("during it", hog_start, hog_end)):
        lateness = [lag for at, lag in lags if lo <= at - start < hi]
        if lateness:
            print(f"the client's own loop lateness {name}: p99 {1000 * np.percentile(lateness, 99):.0f} ms, "
                  f"max {1000 * max(lateness):.0f} ms")


MOVE = re.compile(r"^(\S+ \S+) INFO queue_manager\.manager: pool (\S+): depth (\d+) -> (\d+) \((.*)\)$", re.M)


def summarize_moves(log_text: str, wall_start: float) -> None:
    """Each depth move the service logged (seconds on the report's clock), and how many rises a fall
    undid within 3 s: a rise that went past what the pool holds shows as one."""
    moves = [
        (datetime.strptime(when, "%Y-%m-%d %H:%M:%S,%f").timestamp(), pool, int(old), int(new), why)
        for when, pool, old, new, why in MOVE.findall(log_text)
    ]
    if not moves:
        return
    for when, pool, old, new, why in moves:
        print(f"  {when - wall_start:6.1f} s: {pool} {old} -> {new} ({why})")
    rises = [i for i, move in enumerate(moves) if move[3] > move[2]]
    undone = sum(
        1 for i in rises
        if i + 1 < len(moves) and moves[i + 1][3] < moves[i + 1][2] and moves[i + 1][0] - moves[i][0] < 3
    )
    print(f"depth moves: {len(moves)}, of which {len(rises)} rises; a fall within 3 s undid {undone} of them")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=90)
    parser.add_argument("--hog-at", type=float, default=20)
    parser.add_argument("--hog-for", type=float, default=30)
    parser.add_argument("--load", type=float, default=1.0, help="clients per query of the probed depth")
    parser.add_argument("--slo", type=float, default=1.0)
    # Killed, stop the hog and the service too (run's finally): a hog left running skewed every
    # later run on the machine.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
