"""A real HTTP server in front of a simulated pool, for the estimator's HTTP tests.

POST /embed {"inputs": str | [str]} is served by `estimator.simulated.SimulatedPool` (a known service
time stands in for the model); more than `--limit` queries in flight is answered 429 like the real
service's BUSY. With `--record FILE` it writes the WINDVE_ variables it was started with, and "stopped"
once it has shut down (on SIGTERM, as `windve serve` does).
Run: python sim_server.py --port N [--limit N] [--record FILE].

Unlike the pools of the in-process tests, it serves in real time: its client, in another process,
times it by the wall clock, so no virtual clock can reach its latencies. The tests that go through it
check what does not depend on the machine's speed (what is sent, refused, written and stopped); the
service times are long beside HTTP's own milliseconds so that the levels still land where they should.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from estimator.simulated import ServiceTime, SimulatedPool


def create_app(service: ServiceTime, limit: int, record: Path | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if record is not None:  # uvicorn ends the process with the signal once shut down: say so here
            with record.open("a") as file:
                file.write("stopped\n")

    app = FastAPI(lifespan=lifespan)
    pool = SimulatedPool(service)
    state = {"in_flight": 0}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/info")
    async def info() -> dict:
        return {"model": {"id": "simulated-model", "revision": "sim-rev-1"}, "hardware_fingerprint": "sim-host"}

    @app.post("/embed")
    async def embed(request: Request) -> JSONResponse:
        body = await request.json()
        texts = body["inputs"] if isinstance(body["inputs"], list) else [body["inputs"]]
        if state["in_flight"] + len(texts) > limit:
            return JSONResponse({"error": "busy", "error_type": "overloaded"}, status_code=429)
        state["in_flight"] += len(texts)
        try:
            # Token count as BERT counts single-token words: the words plus [CLS] and [SEP].
            await pool.submit([np.ones(len(text.split()) + 2, dtype=np.int64) for text in texts])
        finally:
            state["in_flight"] -= len(texts)
        return JSONResponse([[0.0] * 4 for _ in texts])

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--limit", type=int, default=1_000_000)
    parser.add_argument("--per-query", type=float, default=0.002)
    parser.add_argument("--per-token", type=float, default=0.0)
    parser.add_argument("--record", type=Path)
    args = parser.parse_args()
    if args.record:
        started = {key: value for key, value in os.environ.items() if key.startswith("WINDVE_")}
        args.record.write_text(json.dumps(started) + "\n")
    service = ServiceTime(per_batch=0.002, per_query=args.per_query, per_token=args.per_token, max_batch_size=8)
    app = create_app(service, args.limit, args.record)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
