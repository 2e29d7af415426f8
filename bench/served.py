"""The engine's ceiling, then the served service under wrk: throughput, overload, pool isolation. One run.

    python bench/served.py [--model DIR] [--seconds 10] [--clients 64,256,1024,4096]
                           [--sections engine,served,overload,isolation] [--config FILE]
                           [--extra-serve-args "..."] [--peers naive,infinity --infinity-bin PATH]

Sections (bench/SERVED.md says more):
- engine: the torch engine in this process on the accelerator when torch sees one (CUDA), else
  the CPU: queries/s at batch 32, 128 and 512 of 75-token queries, no HTTP, no queue;
- served: `windve serve` (embedding cache off) under `wrk -t2 -cC --latency` for each C, one
  75-token text per request drawn in turn from 256 distinct texts: answers/s, 200s/s, p50/p99,
  non-2xx; under each WindVE row, every process role's CPU per 200 (bench/cpu_cost.py), and from
  the service's /metrics where the mean request's time went and how many 200s, of all of them,
  were over the SLO (bench/time_split.py);
- overload: 2x and 10x the service's total depth (GET /info) in clients (`--overload-factors`;
  the sampling connections count among them, so 1x is exactly the depth), wrk asking again at
  once after every answer, 429s included: goodput (200s/s) and its ratio to the served section's peak,
  the 429s, and the worst latency of GET /health polled meanwhile, on a keep-alive connection
  ("health") and on a new connection each time, as a Kubernetes probe asks ("probe");
- isolation: the accelerator pool's admissions per second (windve_pool_dispatched_queries_total,
  read from /metrics while the load runs) with the CPU pool idle (clients = the accelerator
  pool's depth), full (= the total depth) and saturated by overflow (far past it, 429s too),
  and the ratios to the idle rate. Without an accelerator pool (a CPU-only machine on the
  automatic plan) it is skipped; an explicit plan given with --config can put a CPU engine in
  the accelerator pool.
- peers (only with --peers): each peer alone, at the served section's client counts.

Needs Debian's `wrk`. Latencies are wrk's, over every answer whatever its status (see
bench/wrk_embed.lua for the bound on the 200s' own p99); under WindVE, `--samplers` more
connections time the 200s and the 429s apart (the "sampled" line under each row).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench import cpu_cost, time_split  # noqa: E402
from tests.servers import free_port  # noqa: E402
from windve.model import ModelSpec, load_model_spec  # noqa: E402
from windve.tokenizer import FILLER_TEXT, TextTokenizer  # noqa: E402

SECTIONS = ("engine", "served", "overload", "isolation")
WRK_SCRIPT = ROOT / "bench" / "wrk_embed.lua"
RESULT = re.compile(r"^RESULT (.*)$", re.MULTILINE)
DISPATCHED = re.compile(r'^windve_pool_dispatched_queries_total\{pool="([^"]+)"\} ([0-9.eE+-]+)$', re.MULTILINE)
START_TIMEOUT = 900.0  # a big model on a slow disk, CUDA graphs, a calibration probe
CONNECTION_SPARE = 256  # open files wrk, the server and the bench need beside the clients' sockets


# ---- inputs ----------------------------------------------------------------------------


def distinct_texts(
    tokenizer: TextTokenizer,
    count: int,
    tokens: int,
    seed: int = 0,
    units: list[str] | None = None,
    joiner: str = " ",
    exact: bool = True,
) -> list[str]:
    """`count` different natural-looking texts, each exactly `tokens` ids long (special tokens included).

    Each starts at its own place in the filler text, with a few words swapped, cut to the longest
    word prefix that fits and padded with single-token words, as TextTokenizer.text_of_tokens does.
    Another passage may be given as `units` (its words, or its characters with `joiner` "" for a
    script written without spaces); `exact=False` keeps the prefix unpadded (at most `tokens` ids).
    """
    words = units if units is not None else FILLER_TEXT.split()
    rng = random.Random(seed)
    texts: list[str] = []
    seen: set[str] = set()
    while len(texts) < count:
        start = rng.randrange(len(words))
        candidate = (words[start:] + words[:start]) * (2 + tokens // 40)
        for _ in range(4):
            a, b = rng.randrange(tokens // 2), rng.randrange(tokens // 2)
            candidate[a], candidate[b] = candidate[b], candidate[a]
        text = _fit(tokenizer, candidate, tokens, joiner, exact)
        if text not in seen:
            seen.add(text)
            texts.append(text)
    lengths = {len(ids) for ids in tokenizer.encode(texts, truncate=False)}
    if exact and lengths != {tokens}:
        raise RuntimeError(f"texts of {sorted(lengths)} tokens built, {tokens} wanted")
    return texts


def _fit(tokenizer: TextTokenizer, words: list[str], tokens: int, joiner: str = " ", pad: bool = True) -> str:
    def length(text: str) -> int:
        return tokenizer.count_tokens([text], add_special_tokens=True, stop_above=1 << 30)

    low, high = 0, len(words)
    while low < high:
        mid = (low + high + 1) // 2
        if length(joiner.join(words[:mid])) <= tokens:
            low = mid
        else:
            high = mid - 1
    text = joiner.join(words[:low])
    while pad and length(text) < tokens:
        text += " a"
    return text


def write_bodies(texts: list[str], shape: str, model_name: str) -> Path:
    """One JSON body per line, for bench/wrk_embed.lua: TEI's /embed shape or OpenAI's /embeddings."""
    path = Path(tempfile.gettempdir()) / f"served-bodies-{os.getpid()}-{shape}.jsonl"
    if shape == "tei":
        lines = [json.dumps({"inputs": text}) for text in texts]
    else:
        lines = [json.dumps({"input": [text], "model": model_name}) for text in texts]
    path.write_text("\n".join(lines) + "\n")
    return path


# ---- output ----------------------------------------------------------------------------


class Table:
    """Fixed-width columns, printed row by row as results come."""

    def __init__(self, title: str, columns: list[tuple[str, int]]) -> None:
        self.columns = columns
        print(f"\n== {title}", flush=True)
        print(" ".join(f"{name:>{width}}" for name, width in columns), flush=True)

    def row(self, *values: object) -> None:
        cells = []
        for value, (_, width) in zip(values, self.columns):
            if isinstance(value, float):
                text = f"{value:.1f}"
            elif value is None:
                text = "-"
            else:
                text = str(value)
            cells.append(f"{text:>{width}}")
        print(" ".join(cells), flush=True)


def ms(value: float | None) -> float | None:
    return None if value is None or value < 0 else value


# ---- section a: the engine in this process ----------------------------------------------


def engine_ceiling(spec: ModelSpec, tokenizer: TextTokenizer, texts: list[str], args: argparse.Namespace) -> list:
    import torch

    from windve.engines import create_engine, pad_batch

    cuda = torch.cuda.is_available()
    device = "cuda:0" if cuda else "cpu"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    engine = create_engine(spec, "torch", device, args.dtype)
    where = torch.cuda.get_device_name(0) if cuda else f"CPU, {torch.get_num_threads()} torch threads"
    table = Table(
        f"engine: torch {engine.dtype} on {device} ({where}), in process, {args.tokens}-token queries",
        [("batch", 6), ("passes", 7), ("ms/batch", 10), ("queries/s", 10)],
    )
    sequences = tokenizer.encode(texts, truncate=False)
    rows = []
    for size in [int(b) for b in args.engine_batches.split(",")]:
        ids, mask = pad_batch([sequences[i % len(sequences)] for i in range(size)])
        for _ in range(args.engine_warmup):
            engine.embed(ids, mask)
        sync()
        passes = 0
        started = time.perf_counter()
        elapsed = 0.0
        while passes < args.engine_repeats or elapsed < args.engine_min_seconds:
            engine.embed(ids, mask)
            sync()
            passes += 1
            elapsed = time.perf_counter() - started
        rate = size * passes / elapsed
        rows.append({"batch": size, "passes": passes, "ms_per_batch": 1000 * elapsed / passes, "qps": rate})
        table.row(size, passes, 1000 * elapsed / passes, rate)
    del engine
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return rows


# ---- servers and wrk ---------------------------------------------------------------------


def start(command: list[str], port: int, health: str, env: dict, name: str) -> subprocess.Popen:
    log_path = Path(tempfile.gettempdir()) / f"served-{name}-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ | env)
    process.log_path = log_path  # type: ignore[attr-defined]
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} exited with {process.returncode} before answering {health}; "
                               f"{log_path} ends with:\n{tail}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop(process)
    raise TimeoutError(f"{name} did not answer {health} with 200 in {START_TIMEOUT:g} s; see {log_path}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def get_info(port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/info", timeout=30).json()


def pool_depths(port: int) -> dict[str, int]:
    return {pool["name"]: int(pool["depth"]) for pool in get_info(port).get("pools", [])}


def wait_until_idle(port: int, timeout: float = 120.0) -> None:
    """Until WindVE's /info shows no query in flight.

    wrk closes its connections when a run ends; queries already in a running batch still hold
    their queue slots until it finishes, and a run started at once would meet BUSY answers that
    belong to the run before it.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pools = get_info(port).get("pools", [])
        if all(pool["in_flight"] == 0 for pool in pools):
            return
        time.sleep(0.05)
    raise TimeoutError(f"queries still in flight on port {port} after {timeout:g} s")


def dispatched(port: int) -> tuple[float, dict[str, float]]:
    """(when, per pool queries admitted so far): the counter read at about the middle of the GET."""
    sent = time.monotonic()
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return (sent + time.monotonic()) / 2, {pool: float(value) for pool, value in DISPATCHED.findall(text)}


def wrk_cpus(info: dict) -> set[int] | None:
    """The CPUs wrk may use: all but the accelerators' feeding cores (None: no such core).

    A client shares the host with the service here, which it would not in production; on the
    feeding core its threads would take turns with the thread that launches every GPU kernel."""
    feeding = {
        core
        for pool in info.get("plan", {}).get("pools", [])
        for instance in pool.get("instances", [])
        if instance.get("device", "cpu") != "cpu"
        for core in instance.get("cores", [])
    }
    rest = set(os.sched_getaffinity(0)) - feeding
    return rest if feeding and rest else None


def wrk_shards(clients: int) -> int:
    """How many wrk processes carry `clients` connections: one unless one process's open-file limit
    (20,000 on the GPU host, hard) is too small, since each wrk holds one socket per connection."""
    per_process = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - CONNECTION_SPARE
    return max(1, -(-clients // max(1, per_process)))


def start_wrk(port: int, bodies: Path, path: str, clients: int, seconds: float,
              args: argparse.Namespace) -> list[subprocess.Popen]:
    """Start wrk with `clients` connections, as several processes when one cannot hold every
    connection (wrk_shards)."""
    shards = wrk_shards(clients)
    cpus = getattr(args, "wrk_cpus", None)
    processes = []
    for shard in range(shards):
        share = clients // shards + (1 if shard < clients % shards else 0)
        # wrk opens connections // threads per thread: a thread count that divides them opens all.
        threads = max(t for t in range(1, max(1, min(args.wrk_threads, share)) + 1) if share % t == 0)
        command = [
            "wrk", f"-t{threads}", f"-c{share}", f"-d{max(1, round(seconds))}s", "--latency",
            "--timeout", f"{args.wrk_timeout}s", "-s", str(WRK_SCRIPT), f"http://127.0.0.1:{port}", "--", str(bodies),
            path,
        ]
        processes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None))
    return processes


def finish_wrk(processes: list[subprocess.Popen], clients: int) -> dict:
    """wrk's figures; over several processes, counts add up and each latency is the largest of
    theirs (an upper bound: the shards' latencies cannot be merged exactly from their summaries)."""
    shards = [_wrk_result(process) for process in processes]
    seconds_run = max(shard["seconds"] for shard in shards)
    ok, busy, other = (sum(shard[key] for shard in shards) for key in ("ok", "busy", "other"))
    requests = sum(shard["requests"] for shard in shards)
    row = {
        "clients": clients,
        "seconds": seconds_run,
        "answers": requests,
        "rps": requests / seconds_run,
        "ok_rps": ok / seconds_run,
        "ok": ok,
        "busy": busy,
        "other": other,
        "non2xx": busy + other,
        "socket_errors": sum(shard["socket_errors"] for shard in shards),
        "wrk_processes": len(shards),
    }
    for key in ("p50", "p90", "p99", "max", "p99_ok_bound"):
        row[f"{key}_ms"] = max(shard[key] for shard in shards)
    return row


def _wrk_result(process: subprocess.Popen) -> dict:
    stdout, stderr = process.communicate()
    match = RESULT.search(stdout)
    if process.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({process.returncode}): {stdout[-2000:]} {stderr[-2000:]}")
    raw = dict(item.split("=") for item in match.group(1).split())
    counts = {key: int(raw[key]) for key in ("requests", "ok", "busy", "other")}
    latencies = {key: float(raw[key]) for key in ("seconds", "p50", "p90", "p99", "max", "p99_ok_bound")}
    return counts | latencies | {"socket_errors": sum(int(raw[key]) for key in ("connect", "read", "write", "timeout"))}


def run_wrk(port: int, bodies: Path, path: str, clients: int, seconds: float, args: argparse.Namespace) -> dict:
    return finish_wrk(start_wrk(port, bodies, path, clients, seconds, args), clients)


def run_wrk_watched(port: int, bodies: Path, clients: int, args: argparse.Namespace) -> dict:
    """run_wrk, with each pool's depth control read from /info one second before wrk ends.

    Read under load, because the depth and the live tail are what they are while it lasts; the
    line printed under the row says whether the depth moved and why."""
    serve_pid = getattr(args, "serve_pid", None)
    before = cpu_cost.snapshot(serve_pid) if serve_pid else None
    timed_before = time_split.snapshot(port, args.slo)
    processes = start_wrk(port, bodies, "/embed", clients, args.seconds, args)
    sampler = Sampler(port, bodies, args.samplers) if args.samplers else None
    if sampler:
        sampler.start()
    time.sleep(max(0.0, args.seconds - 1.0))
    try:
        pools = get_info(port).get("pools", [])
    except httpx.HTTPError as error:
        pools, late = [], repr(error)
    else:
        late = None
    row = finish_wrk(processes, clients)
    after = cpu_cost.snapshot(serve_pid) if serve_pid else None
    row["sampled"] = sampler.finish() if sampler else None
    row["time_split"] = time_split.split(timed_before, time_split.snapshot(port, args.slo))
    if before is not None and after is not None:
        answered = row["ok"] + (row["sampled"]["ok"] if row["sampled"] else 0)
        row["cpu_cost"] = cpu_cost.cost_per_request(before, after, answered)
    row["sampler_connections"] = args.samplers
    row["control"] = {
        pool["name"]: {"depth": pool["depth"], "live_p99_s": pool["control"].get("live_p99"),
                       "reason": pool["control"].get("reason")}
        for pool in pools
    }
    row["control_error"] = late
    return row


def print_control(row: dict) -> None:
    def tail(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.0f} ms"

    described = "; ".join(
        f"{name} depth {c['depth']}, live p99 {tail(c['live_p99_s'])} ({c['reason']})"
        for name, c in row["control"].items()
    )
    if not described:
        described = f"/info did not answer: {row['control_error']}"
    print(f"    1 s before the end: {described}", flush=True)
    if row["wrk_processes"] > 1:
        print(f"    wrk ran as {row['wrk_processes']} processes (open-file limit): "
              "its latencies are the largest of theirs")


def percentile_ms(ordered: list[float], q: float) -> float | None:
    """The q-quantile of sorted seconds, in ms (the nearest rank at or below); None for none."""
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


class Sampler:
    """A few more closed-loop clients beside wrk that time each answer with its status.

    wrk's latency histogram covers every answer whatever its status, so under overload its
    bound on the 200s' p99 (bench/wrk_embed.lua) is only as good as the 429s are fast. These
    clients (plain http.client, one keep-alive connection each, re-asking at once like wrk's)
    give the 200s' own latencies, a sample of them."""

    def __init__(self, port: int, bodies: Path, connections: int) -> None:
        self.port = port
        self.bodies = [line.encode() for line in bodies.read_text().splitlines() if line]
        self.answers: list[tuple[int, float]] = []
        self._halt = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(connections)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _run(self, index: int) -> None:
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        position = index * 31
        while not self._halt.is_set():
            body = self.bodies[position % len(self.bodies)]
            position += 1
            started = time.perf_counter()
            try:
                connection.request("POST", "/embed", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                connection.close()
                status = 0
            self.answers.append((status, time.perf_counter() - started))
        connection.close()

    def finish(self) -> dict:
        self._halt.set()
        for thread in self._threads:
            thread.join(90)
        ok = sorted(seconds for status, seconds in self.answers if status == 200)
        busy = sorted(seconds for status, seconds in self.answers if status == 429)
        pct = percentile_ms
        return {"answers": len(self.answers), "ok": len(ok), "busy": len(busy),
                "ok_p50_ms": pct(ok, 0.5), "ok_p99_ms": pct(ok, 0.99), "ok_max_ms": 1000 * ok[-1] if ok else None,
                "busy_p50_ms": pct(busy, 0.5), "busy_p99_ms": pct(busy, 0.99)}


def print_sampled(row: dict) -> None:
    sampled = row.get("sampled")
    if not sampled:
        return

    def show(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f} ms"

    print(f"    sampled ({sampled['answers']} answers on {row['sampler_connections']} more connections): "
          f"{sampled['ok']} 200s p50 {show(sampled['ok_p50_ms'])} p99 {show(sampled['ok_p99_ms'])} "
          f"max {show(sampled['ok_max_ms'])}; {sampled['busy']} 429s p50 {show(sampled['busy_p50_ms'])} "
          f"p99 {show(sampled['busy_p99_ms'])}", flush=True)


def print_cost(row: dict) -> None:
    if row.get("cpu_cost"):
        print(f"    {cpu_cost.describe(row['cpu_cost'])}", flush=True)
    if row.get("time_split"):
        print(f"    from /metrics, means: {time_split.describe(row['time_split'])}", flush=True)


class HealthPoller(threading.Thread):
    """GET /health in a loop, recording each answer's latency: on one keep-alive connection, or
    (`fresh`) on a new connection each time, from connect to close, as a Kubernetes probe asks."""

    def __init__(self, port: int, interval: float, fresh: bool = False) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.url = f"http://127.0.0.1:{port}/health"
        self.interval = interval
        self.fresh = fresh
        self.latencies: list[float] = []
        self.failures = 0  # non-200 answers and transport errors
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._halt.is_set():
                started = time.perf_counter()
                status = self._probe() if self.fresh else self._get(client)
                self.latencies.append(time.perf_counter() - started)
                if status != 200:
                    self.failures += 1
                self._halt.wait(self.interval)

    def _get(self, client: httpx.Client) -> int | None:
        try:
            return client.get(self.url).status_code
        except httpx.HTTPError:
            return None

    def _probe(self) -> int | None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
                answer = b""
                while chunk := sock.recv(4096):
                    answer += chunk
        except OSError:
            return None
        parts = answer.split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None

    def finish(self) -> dict:
        self._halt.set()
        self.join()
        ordered = sorted(self.latencies)
        return {
            "polls": len(ordered),
            "failures": self.failures,
            "max_ms": 1000 * ordered[-1] if ordered else None,
            "p99_ms": percentile_ms(ordered, 0.99),
        }


# ---- sections b, c, d: the served service -------------------------------------------------

SERVED_COLUMNS = [
    ("clients", 7), ("answers/s", 9), ("200s/s", 8), ("p50 ms", 8), ("p99 ms", 8), ("p99 200s<=", 10),
    ("non-2xx", 8), ("429s", 8), ("sock err", 8),
]


def served_row(table: Table, row: dict) -> None:
    table.row(row["clients"], row["rps"], row["ok_rps"], row["p50_ms"], row["p99_ms"], ms(row["p99_ok_bound_ms"]),
              row["non2xx"], row["busy"], row["socket_errors"])


def settle_level(port: int, bodies: Path, clients: int, args: argparse.Namespace) -> None:
    """`--level-settle` seconds of the level's load, unreported, so that WindVE's adaptive depths have
    met it; then drained: what the settling run left in flight is not the measured run's."""
    if args.level_settle > 0:
        run_wrk(port, bodies, "/embed", clients, args.level_settle, args)
        wait_until_idle(port)


def served(port: int, bodies: Path, path: str, clients: list[int], args: argparse.Namespace, name: str,
           windve: bool) -> list[dict]:
    table = Table(f"served: {name}, {args.seconds:g} s per level, wrk closed loop, one {args.tokens}-token text "
                  "per request (p99 200s<=: bound on the 200s' own p99, bench/wrk_embed.lua)", SERVED_COLUMNS)
    rows = []
    for c in clients:
        if windve:
            wait_until_idle(port)
        if windve:
            settle_level(port, bodies, c, args)
        row = run_wrk_watched(port, bodies, c, args) if windve else run_wrk(port, bodies, path, c, args.seconds, args)
        served_row(table, row)
        if windve:
            print_control(row)
            print_sampled(row)
            print_cost(row)
        rows.append(row)
    return rows


def overload(port: int, bodies: Path, peak: float | None, args: argparse.Namespace) -> list[dict]:
    depths = pool_depths(port)
    total = sum(depths.values())
    shown = ", ".join(f"{name} {depth}" for name, depth in depths.items())
    table = Table(
        f"overload: total depth {total} ({shown}); wrk asks again at once after every answer, 429s included; "
        f"GET /health polled every {args.health_interval * 1000:g} ms meanwhile",
        [("x depth", 7), ("clients", 7), ("answers/s", 9), ("200s/s", 8), ("goodput/peak", 12), ("p99 ms", 8),
         ("p99 200s<=", 10), ("429s", 8), ("other", 6), ("sock err", 8), ("health max ms", 13),
         ("probe max ms", 12), ("polls", 6), ("health!=200", 11)],
    )
    rows = []
    for factor in [float(f) for f in args.overload_factors.split(",")]:
        # The sampling connections count among the level's clients, so that 1x is exactly the
        # depth: on top of it, some of a full pool's clients are refused at 1x.
        clients = max(1, round(factor * total) - args.samplers)
        wait_until_idle(port)
        # Through the settling run too: one keep-alive poller and one that connects anew each time.
        pollers = [HealthPoller(port, args.health_interval, fresh) for fresh in (False, True)]
        for poller in pollers:
            poller.start()
        try:
            settle_level(port, bodies, clients, args)
            row = run_wrk_watched(port, bodies, clients, args)
        finally:
            health, probe = (poller.finish() for poller in pollers)
        row |= {"factor": factor, "total_depth": total, "depths": depths, "health": health, "probe": probe,
                "goodput_over_peak": row["ok_rps"] / peak if peak else None}
        rows.append(row)
        row["connections"] = row["clients"] + row["sampler_connections"]
        table.row(f"{factor:g}x", row["connections"], row["rps"], row["ok_rps"],
                  f"{row['goodput_over_peak']:.2f}" if peak else "n/a", row["p99_ms"], ms(row["p99_ok_bound_ms"]),
                  row["busy"], row["other"], row["socket_errors"], health["max_ms"], probe["max_ms"],
                  health["polls"] + probe["polls"], health["failures"] + probe["failures"])
        print_control(row)
        print_sampled(row)
        print_cost(row)
    if not peak:
        print("  goodput/peak: n/a, the served section did not run (add it to --sections)")
    return rows


def isolation(port: int, bodies: Path, args: argparse.Namespace) -> dict | None:
    depths = pool_depths(port)
    if "accelerator" not in depths:
        print("\n== isolation\nno accelerator pool: skipped (a CPU-only machine has one only with an explicit plan: "
              "--config FILE, see bench/SERVED.md)", flush=True)
        return None
    accelerator = depths["accelerator"]
    total = sum(depths.values())
    # Idle: the accelerator pool's depth in clients, no overflow. Full: the total depth, the CPU pool
    # busy but nobody turned away. Saturated: far past it, the CPU pool full and the front end
    # answering 429s besides (on a small host both take CPU time from the accelerator's feeding).
    loads = [
        ("CPU pool idle", accelerator),
        ("CPU pool full", total),
        ("CPU pool saturated", max(round(args.saturate_factor * total), total + accelerator)),
    ]
    table = Table(
        f"isolation: accelerator pool's admissions/s (windve_pool_dispatched_queries_total), counted over "
        f"{args.seconds:g} s after {args.isolation_settle:g} s of load; "
        f"depths {', '.join(f'{name} {depth}' for name, depth in depths.items())}",
        [("load", 18), ("clients", 7), ("accel q/s", 10), ("cpu q/s", 8), ("200s/s", 8), ("p99 ms", 8),
         ("429s", 8), ("accel depth after", 17)],
    )
    rows = {}
    for label, clients in loads:
        wait_until_idle(port)
        # Counted from `settle` s into the run, not over the burst that first fills the queues, and
        # ended 2 s before wrk stops, so that a slow GET /metrics still reads the counters under load.
        processes = start_wrk(port, bodies, "/embed", clients, args.isolation_settle + args.seconds + 2, args)
        time.sleep(args.isolation_settle)
        started, before = dispatched(port)
        time.sleep(max(0.0, started + args.seconds - time.monotonic()))
        ended, after = dispatched(port)
        row = finish_wrk(processes, clients)
        rates = {pool: (after.get(pool, 0.0) - before.get(pool, 0.0)) / (ended - started) for pool in after}
        row |= {"dispatched_per_s": rates, "counted_seconds": ended - started, "depths_after": pool_depths(port)}
        rows[label] = row
        table.row(label, row["clients"], rates.get("accelerator"), rates.get("cpu"), row["ok_rps"], row["p99_ms"],
                  row["busy"], row["depths_after"].get("accelerator"))
    idle = rows["CPU pool idle"]["dispatched_per_s"].get("accelerator") or 0.0
    ratios = {}
    for label in ("CPU pool full", "CPU pool saturated"):
        rate = rows[label]["dispatched_per_s"].get("accelerator") or 0.0
        ratios[label] = rate / idle if idle else None
        print(f"  accelerator pool's admissions/s, {label} / CPU pool idle: {rate:.1f} / {idle:.1f} = "
              + (f"{ratios[label]:.3f}" if idle else "n/a (nothing admitted in the idle run)"))
    return {"rows": rows, "ratio_full": ratios["CPU pool full"], "ratio_saturated": ratios["CPU pool saturated"]}


def windve_command(port: int, args: argparse.Namespace) -> list[str]:
    command = [sys.executable, "-m", "windve.commands.serve", "--host", "127.0.0.1", "--port", str(port)]
    if args.model:
        command += ["--model", args.model]
    if args.config:
        command += ["--config", args.config]
    return command + shlex.split(args.extra_serve_args)


def run_windve(bodies: Path, clients: list[int], sections: set[str], args: argparse.Namespace) -> dict:
    port = args.port or free_port()
    results: dict = {}
    process = start(windve_command(port, args), port, "/health", {"HF_HUB_OFFLINE": "1", "WINDVE_CACHE_SIZE": "0"},
                    "windve")
    try:
        info = get_info(port)
        plan = ", ".join(
            f"{pool['name']} depth {pool['depth']} ({len(pool.get('instances', []))} instances)"
            for pool in info.get("pools", [])
        )
        print(f"\nwindve serve on port {port} (log {process.log_path}): model {info.get('model_id')}, "
              f"{info.get('model_dtype')}; pools: {plan}", flush=True)
        args.wrk_cpus = wrk_cpus(info)
        args.serve_pid = process.pid
        run_wrk(port, bodies, "/embed", 4, args.warmup_seconds, args)  # warm-up, not reported
        if "served" in sections:
            results["served"] = served(port, bodies, "/embed", clients, args, "windve", windve=True)
        if "overload" in sections:
            peak = max((row["ok_rps"] for row in results.get("served", [])), default=None)
            results["overload"] = overload(port, bodies, peak, args)
        if "isolation" in sections:
            results["isolation"] = isolation(port, bodies, args)
    finally:
        stop(process)
    return results


def run_peers(spec: ModelSpec, texts: list[str], clients: list[int], args: argparse.Namespace) -> dict:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = args.model or str(spec.path)
    peers = {
        "naive": ([sys.executable, str(ROOT / "bench/peers/naive_st_server.py"), "--model", model,
                   "--device", device], "/embed", "tei"),
    }
    if args.infinity_bin:
        peers["infinity"] = ([args.infinity_bin, "v2", "--model-id", model, "--host", "127.0.0.1", "--engine", "torch",
                              "--device", device, "--no-model-warmup"], "/embeddings", "openai")
    results = {}
    for name in [name.strip() for name in args.peers.split(",") if name.strip()]:
        if name not in peers:
            print(f"\npeer {name}: skipped ({'give --infinity-bin' if name == 'infinity' else 'unknown'})")
            continue
        command, path, shape = peers[name]
        port = free_port()
        bodies = write_bodies(texts, shape, model)
        process = start(command + ["--port", str(port)], port, "/health", {"HF_HUB_OFFLINE": "1"}, name)
        try:
            run_wrk(port, bodies, path, 4, args.warmup_seconds, args)
            results[name] = served(port, bodies, path, clients, args, name, windve=False)
        finally:
            stop(process)
    return results


def slo_summary(by_server: dict[str, list[dict]], slo: float) -> None:
    print(f"\nlargest concurrency with p99 <= {slo:g} s and only 200s, and the peak of 200s per second:")
    for name, rows in by_server.items():
        within = [
            r["clients"] for r in rows
            if r["ok"] > 0 and r["p99_ms"] <= slo * 1000 and r["non2xx"] == 0 and r["socket_errors"] == 0
        ]
        peak = max(r["ok_rps"] for r in rows)
        print(f"  {name:>8}: {max(within) if within else 'none'} clients; peak {peak:.1f} 200s/s")


def raise_open_files(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # wrk and the servers inherit it
    if hard < needed:
        print(f"warning: {needed} connections wanted, the open-file limit is {hard}: wrk runs as several processes, "
              "and a server process that takes more than that many refuses some")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--seconds", type=int, default=10, help="per wrk run")
    parser.add_argument("--clients", default="64,256,1024,4096", help="served section's wrk connections")
    parser.add_argument("--port", type=int, default=None, help="windve serve's port (default: a free one)")
    parser.add_argument("--config", default=None, help="settings file passed to windve serve --config")
    parser.add_argument("--extra-serve-args", default="", help='more windve serve flags, e.g. "--depth-control static"')
    parser.add_argument("--tokens", type=int, default=75)
    parser.add_argument("--texts", type=int, default=256, help="distinct texts the requests cycle through")
    parser.add_argument("--dtype", default="auto", help="engine section's dtype (auto: as windve serve picks)")
    parser.add_argument("--engine-batches", default="32,128,512")
    parser.add_argument("--engine-repeats", type=int, default=3, help="timed passes per batch, at least")
    parser.add_argument("--engine-min-seconds", type=float, default=1.0, help="timed seconds per batch, at least")
    parser.add_argument("--engine-warmup", type=int, default=2, help="untimed passes per batch")
    parser.add_argument("--overload-factors", default="2,10", help="clients as multiples of the total depth")
    parser.add_argument("--saturate-factor", type=float, default=4.0,
                        help="isolation: clients as a multiple of the total depth for the saturated run")
    parser.add_argument("--isolation-settle", type=float, default=2.0,
                        help="isolation: seconds of load before the admissions are counted")
    parser.add_argument("--samplers", type=int, default=8,
                        help="more closed-loop connections, beside wrk's, that time the 200s apart (0: none)")
    parser.add_argument("--health-interval", type=float, default=0.05, help="seconds between /health polls")
    parser.add_argument("--warmup-seconds", type=float, default=3)
    parser.add_argument("--level-settle", type=float, default=0,
                        help="served and overload sections, WindVE: seconds of each level's load run unreported "
                             "before it is measured, so that adaptive depths have met the level (peers keep no such "
                             "state); /health is polled through it")
    parser.add_argument("--wrk-threads", type=int, default=2)
    parser.add_argument("--wrk-timeout", type=int, default=30, help="seconds before wrk counts a request timed out")
    parser.add_argument("--peers", default="", help="also measure peers at --clients: naive, infinity")
    parser.add_argument("--infinity-bin", default=None, help="infinity_emb executable, for --peers infinity")
    parser.add_argument("--slo", type=float, default=1.0,
                        help="the service's SLO in seconds: for the summary, and the 200s over it")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    sections = {name.strip() for name in args.sections.split(",") if name.strip()}
    if sections - set(SECTIONS):
        parser.error(f"unknown sections {sorted(sections - set(SECTIONS))}; known: {', '.join(SECTIONS)}")
    if (sections - {"engine"} or args.peers) and shutil.which("wrk") is None:
        sys.exit("wrk is needed: apt-get install wrk")
    clients = [int(c) for c in args.clients.split(",")]
    raise_open_files(max(clients) + CONNECTION_SPARE)

    spec = load_model_spec(args.model)
    tokenizer = TextTokenizer(spec)
    texts = distinct_texts(tokenizer, args.texts, args.tokens)
    print(f"model {spec.name} ({spec.path}), {len(texts)} distinct {args.tokens}-token texts", flush=True)
    results: dict = {"model": str(spec.path), "args": vars(args)}

    if "engine" in sections:
        results["engine"] = engine_ceiling(spec, tokenizer, texts, args)
    if sections & {"served", "overload", "isolation"}:
        bodies = write_bodies(texts, "tei", spec.name)
        results |= run_windve(bodies, clients, sections, args)
    if args.peers:
        results["peers"] = run_peers(spec, texts, clients, args)
    by_server = ({"windve": results["served"]} if results.get("served") else {}) | results.get("peers", {})
    if by_server:
        slo_summary(by_server, args.slo)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
