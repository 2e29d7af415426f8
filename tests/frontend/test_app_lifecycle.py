"""What the app answers before its runtime is ready, and after the runtime failed to start.

A load that never finishes is injected through `create_app`'s runtime factory, since a real
load finishes on its own schedule; the failed start is the real `Runtime.start` on a missing model.
"""

from __future__ import annotations

import asyncio
import threading

from starlette.testclient import TestClient

from windve.frontend.app import create_app
from windve.settings import Settings


async def never_ready(settings: Settings):
    await asyncio.Event().wait()


def test_loading_service_answers_503_in_each_routes_shape():
    with TestClient(create_app(Settings(), start_runtime=never_ready)) as client:
        for path in ("/health", "/"):
            assert client.get(path).status_code == 503
            assert client.get(path).json() == {"status": "starting"}
        for path in ("/embed", "/", "/tokenize"):
            tei = client.post(path, json={"inputs": "x"})
            assert tei.status_code == 503 and tei.json()["error_type"] == "unhealthy", path
            assert tei.headers["retry-after"] == "1"
        for path in ("/v1/models", "/v1/models/any"):
            openai = client.get(path)
            assert openai.status_code == 503, path
            assert openai.json()["error"]["code"] == "unavailable"
        for path in ("/v1/embeddings", "/embeddings"):
            embeddings = client.post(path, json={"input": "x"})
            assert embeddings.status_code == 503 and "still loading" in embeddings.json()["error"]["message"]
        assert client.get("/info").json()["ready"] is False


def test_failed_start_is_reported_by_health_and_the_fatal_hook():
    reported: list[str] = []
    done = threading.Event()

    def on_fatal(message: str) -> None:
        reported.append(message)
        done.set()

    with TestClient(create_app(Settings(model="/nowhere/model"), on_fatal=on_fatal)) as client:
        assert done.wait(30)
        [message] = reported
        assert message.startswith("ModelError: ") and "/nowhere/model" in message
        health = client.get("/health")
        assert health.status_code == 503
        assert health.json() == {"status": "failed", "error": message}
