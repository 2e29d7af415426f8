"""Served throughput and tail latency, WindVE beside its peers, in one run, measured with wrk.

Closed loop, one 75-token text per request, `wrk -t1 -c C` for each concurrency C, each server
alone on the machine while it is measured (the load generator shares the cores: wrk is cheap,
but its share is not zero). Peers:
- naive: FastAPI + sentence-transformers (bench/peers/naive_st_server.py), TEI /embed shape;
- infinity: `infinity_emb v2` (OpenAI /embeddings shape), when `--infinity-bin` is given.

    python bench/served.py [--clients 1,8,16,32,64] [--seconds 15] [--infinity-bin PATH/infinity_emb]

Needs Debian's `wrk`. Prints req/s, p50/p99 and non-2xx answers per server and concurrency, and
per server the largest concurrency whose p99 stayed under the SLO with every answer a 200.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import free_port  # noqa: E402
from windve.model import load_model_spec  # noqa: E402
from windve.tokenizer import TextTokenizer  # noqa: E402

LUA = """
wrk.method = "POST"
wrk.path = "{path}"
wrk.headers["Content-Type"] = "application/json"
wrk.body = {body}
done = function(summary, latency, requests)
  io.write(string.format("RESULT rps=%.2f ok_rps=%.2f p50=%.2f p99=%.2f non2xx=%d sockerr=%d\\n",
    summary.requests / (summary.duration / 1e6), (summary.requests - summary.errors.status) / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


def lua_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def start(command: list[str], port: int, health: str, env: dict | None = None) -> subprocess.Popen:
    log = open(Path(tempfile.gettempdir()) / f"served-{port}.log", "wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ | (env or {}))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[:3]} exited; see {log.name}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise TimeoutError(f"{command[:3]} did not become healthy")


def wait_until_idle(port: int, timeout: float = 60.0) -> None:
    """Until WindVE's /info shows no query in flight.

    wrk closes its connections when a run ends; queries already in a running batch still hold
    their queue slots until it finishes, and a run started at once would meet BUSY answers that
    belong to the run before it.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pools = httpx.get(f"http://127.0.0.1:{port}/info", timeout=5).json().get("pools", [])
        if all(pool["in_flight"] == 0 for pool in pools):
            return
        time.sleep(0.05)
    raise TimeoutError(f"queries still in flight on port {port} after {timeout:g} s")


def run_wrk(port: int, script: Path, clients: int, seconds: int) -> dict:
    output = subprocess.run(
        ["wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "--timeout", "10s", "-s", str(script), f"http://127.0.0.1:{port}"],
        capture_output=True, text=True, check=True,
    ).stdout
    match = re.search(
        r"RESULT rps=([\d.]+) ok_rps=([\d.]+) p50=([\d.]+) p99=([\d.]+) non2xx=(\d+) sockerr=(\d+)", output
    )
    rps, ok_rps, p50, p99, non2xx, sockerr = match.groups()
    return {
        "rps": float(rps), "ok_rps": float(ok_rps), "p50_ms": float(p50), "p99_ms": float(p99),
        "non2xx": int(non2xx), "socket_errors": int(sockerr),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,8,16,32,64")
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--slo", type=float, default=1.0)
    parser.add_argument("--infinity-bin", default=None)
    parser.add_argument("--servers", default="windve,naive,infinity")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is needed: apt-get install wrk")
    clients = [int(c) for c in args.clients.split(",")]
    spec = load_model_spec()
    text = TextTokenizer(spec).text_of_tokens(75)
    tei_body = lua_string(json.dumps({"inputs": text}))
    openai_body = lua_string(json.dumps({"input": [text], "model": str(spec.path)}))
    env = {"HF_HUB_OFFLINE": "1"}
    servers = {
        "windve": (lambda p: [sys.executable, "-m", "windve.commands.serve", "--port", str(p), "--cache-size", "0"],
                   "/embed", tei_body, "/health"),
        "naive": (lambda p: [sys.executable, str(ROOT / "bench/peers/naive_st_server.py"), "--port", str(p)],
                  "/embed", tei_body, "/health"),
    }
    if args.infinity_bin:
        servers["infinity"] = (
            lambda p: [args.infinity_bin, "v2", "--model-id", str(spec.path), "--port", str(p), "--host", "127.0.0.1",
                       "--engine", "torch", "--device", "cpu", "--no-model-warmup"],
            "/embeddings", openai_body, "/health",
        )
    wanted = [name for name in args.servers.split(",") if name in servers]
    results: dict[str, list[dict]] = {}
    # req/s counts every answer, a BUSY (429) too; 200/s only the embeddings served.
    print(f"{'server':>8} {'clients':>7} {'req/s':>8} {'200/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8} "
          f"{'sock err':>8}")
    for name in wanted:
        command, path, body, health = servers[name]
        port = free_port()
        script = Path(tempfile.gettempdir()) / f"served-{name}.lua"
        script.write_text(LUA.format(path=path, body=body))
        process = start(command(port), port, health, env)
        try:
            run_wrk(port, script, 4, 3)  # warm-up, not reported
            if name == "windve":  # clients past the depth get BUSY at once: say where that starts
                pools = httpx.get(f"http://127.0.0.1:{port}/info", timeout=5).json()["pools"]
                print("  windve depths: " + ", ".join(f"{p['name']} {p['depth']}" for p in pools), flush=True)
            results[name] = []
            for c in clients:
                if name == "windve":
                    wait_until_idle(port)
                row = run_wrk(port, script, c, args.seconds) | {"clients": c}
                results[name].append(row)
                print(f"{name:>8} {c:>7} {row['rps']:>8.1f} {row['ok_rps']:>8.1f} {row['p50_ms']:>8.1f} "
                      f"{row['p99_ms']:>8.1f} {row['non2xx']:>8} {row['socket_errors']:>8}", flush=True)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    print(f"\nlargest concurrency with p99 <= {args.slo:g} s and only 200s, and the peak of 200s per second:")
    for name, rows in results.items():
        within = [
            r["clients"] for r in rows
            if r["p99_ms"] <= args.slo * 1000 and r["non2xx"] == 0 and r["socket_errors"] == 0
        ]
        peak = max(r["ok_rps"] for r in rows)
        print(f"  {name:>8}: {max(within) if within else 'none'} clients; peak {peak:.1f} answers 200/s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
