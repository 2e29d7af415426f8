"""A real HTTP server in front of a simulated pool, for the estimator's `--url` tests.

POST /embed {"inputs": str | [str]} is served by `estimator.simulated.SimulatedPool` (a
known service time stands in for the model); more than `--limit` queries in flight is
answered 429 like the real service's BUSY. Run: python sim_server.py --port N [--limit N].
"""

from __future__ import annotations

import argparse

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from estimator.simulated import ServiceTime, SimulatedPool


def create_app(service: ServiceTime, limit: int) -> FastAPI:
    app = FastAPI()
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
    args = parser.parse_args()
    service = ServiceTime(per_batch=0.002, per_query=args.per_query, per_token=args.per_token, max_batch_size=8)
    uvicorn.run(create_app(service, args.limit), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
