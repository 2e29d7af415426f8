"""HTTP routes: /embed and /tokenize (TEI shape), /v1/embeddings and /v1/models (OpenAI shape),
/health, /info, /metrics.

`POST /` answers as /embed and `GET /` as /health, as TEI's do for an embedding model
(huggingface_hub's InferenceClient posts there); /embeddings and /models answer as their /v1
twins, where Infinity serves them by default.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

import windve
from windve.frontend import metrics
from windve.frontend.body import read_json
from windve.frontend.errors import NOT_FOUND, UNAUTHORIZED, ApiError, json_response
from windve.frontend.pipeline import ClientGone, EmbeddingPipeline
from windve.frontend.schemas import (
    EmbedRequest,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
    OpenAIError,
    OpenAIModel,
    OpenAIModelList,
    TeiError,
    TeiToken,
    TokenizeRequest,
    parse,
    request_schema,
)

router = APIRouter()

BodyModel = TypeVar("BodyModel", bound=BaseModel)

CLIENT_CLOSED = 499  # nginx's code: nobody reads it, but logs and metrics say what happened

_TEI_ERRORS = {code: {"model": TeiError} for code in (401, 413, 422, 429, 503)}
_OPENAI_ERRORS = {code: {"model": OpenAIError} for code in (401, 413, 422, 429, 503)}
_MODELS_ERRORS = {code: {"model": OpenAIError} for code in (401, 503)}


def _state(request: Request):
    return request.app.state


def check_api_key(request: Request) -> None:
    expected = _state(request).settings.api_key
    if not expected:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise ApiError(401, "missing or wrong API key: send `Authorization: Bearer <key>`", UNAUTHORIZED)


async def _request_body(request: Request, model: type[BodyModel]) -> BodyModel:
    """The JSON body, within the size limit, validated as `model` (a 413 or 422 ApiError if not)."""
    return parse(model, await read_json(request, _state(request).settings.max_request_bytes))


def _pipeline(request: Request) -> EmbeddingPipeline:
    pipeline = _state(request).pipeline
    if pipeline is None:
        raise ApiError(503, "the model is still loading; retry shortly", "unhealthy", retry_after=1)
    return pipeline


async def _answered(
    request: Request,
    route: str,
    handle: Callable[[], Awaitable[Response]],
    error_shape: Callable[[ApiError], Response],
) -> Response:
    """Run a route's handler with the key check, its error shape and the request metrics."""
    started = time.perf_counter()
    status = 200
    try:
        check_api_key(request)
        return await handle()
    except ApiError as error:
        status = error.status
        metrics.ERRORS.labels(route, error.error_type).inc()
        return error_shape(error)
    except ClientGone:
        status = CLIENT_CLOSED
        return Response(status_code=CLIENT_CLOSED)
    finally:
        metrics.REQUESTS.labels(route, str(status)).inc()
        metrics.E2E_TIME.labels(route).observe(time.perf_counter() - started)


_EMBED_ROUTE = {
    "response_model": list[list[float]],
    "responses": _TEI_ERRORS,
    "openapi_extra": request_schema(EmbedRequest),
}


@router.post("/embed", summary="Embed texts (text-embeddings-inference shape)", **_EMBED_ROUTE)
@router.post("/", summary="Same as /embed: where TEI clients given only a base URL post", **_EMBED_ROUTE)
async def embed(request: Request) -> Response:
    async def handle() -> Response:
        body = await _request_body(request, EmbedRequest)
        vectors, _ = await _pipeline(request).embed(body.texts, body.normalize, body.truncate, request, "inputs")
        return json_response(vectors)

    return await _answered(request, "embed", handle, ApiError.tei_response)


@router.post(
    "/tokenize",
    summary="The model's tokens of each text, untruncated (text-embeddings-inference shape)",
    response_model=list[list[TeiToken]],
    responses=_TEI_ERRORS,
    openapi_extra=request_schema(TokenizeRequest),
)
async def tokenize(request: Request) -> Response:
    async def handle() -> Response:
        body = await _request_body(request, TokenizeRequest)
        pipeline = _pipeline(request)
        pipeline.check_inputs(body.texts, "inputs")
        # A full-size body takes most of a second to tokenize: off the event loop, which serves the queues.
        rows = await asyncio.to_thread(pipeline.runtime.tokenizer.tokens, body.texts, body.add_special_tokens)
        return json_response(rows)

    return await _answered(request, "tokenize", handle, ApiError.tei_response)


_EMBEDDINGS_ROUTE = {
    "response_model": OpenAIEmbeddingResponse,
    "responses": _OPENAI_ERRORS,
    "openapi_extra": request_schema(OpenAIEmbeddingRequest),
}


@router.post("/v1/embeddings", summary="Embed texts (OpenAI embeddings shape)", **_EMBEDDINGS_ROUTE)
@router.post("/embeddings", summary="Same as /v1/embeddings, at Infinity's default path", **_EMBEDDINGS_ROUTE)
async def openai_embeddings(request: Request) -> Response:
    async def handle() -> Response:
        body = await _request_body(request, OpenAIEmbeddingRequest)
        pipeline = _pipeline(request)
        spec = pipeline.runtime.spec
        if body.dimensions is not None and body.dimensions != spec.dim:
            raise ApiError(
                422, f"dimensions={body.dimensions} is not supported: {spec.name} has {spec.dim}", "validation",
                param="dimensions",
            )
        vectors, tokens = await pipeline.embed(body.texts, spec.normalize, None, request, "input")
        if body.encoding_format == "base64":
            items = [base64.b64encode(row.astype("<f4").tobytes()).decode() for row in vectors]
        else:
            items = list(vectors)
        return json_response(
            {
                "object": "list",
                "data": [{"object": "embedding", "index": i, "embedding": item} for i, item in enumerate(items)],
                "model": spec.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    return await _answered(request, "openai", handle, ApiError.openai_response)


def _served_model(request: Request) -> dict:
    """The OpenAI model object of the one model this service serves."""
    pipeline = _pipeline(request)
    return OpenAIModel(
        id=pipeline.runtime.spec.name, created=_state(request).ready_since, owned_by="windve"
    ).model_dump()


@router.get("/v1/models", summary="The served model (OpenAI models shape)", response_model=OpenAIModelList,
            responses=_MODELS_ERRORS)
@router.get("/models", summary="Same as /v1/models, at Infinity's default path", response_model=OpenAIModelList,
            responses=_MODELS_ERRORS)
async def openai_models(request: Request) -> Response:
    async def handle() -> Response:
        return json_response({"object": "list", "data": [_served_model(request)]})

    return await _answered(request, "models", handle, ApiError.openai_response)


@router.get(
    "/v1/models/{model_id:path}",
    summary="One model by id (OpenAI models shape); 404 for any but the served one",
    response_model=OpenAIModel,
    responses={**_MODELS_ERRORS, 404: {"model": OpenAIError}},
)
async def openai_model(request: Request, model_id: str) -> Response:
    async def handle() -> Response:
        model = _served_model(request)
        if model_id != model["id"]:
            raise ApiError(
                404, f"the model '{model_id}' does not exist here; this service serves '{model['id']}'", NOT_FOUND,
                param="model",
            )
        return json_response(model)

    return await _answered(request, "models", handle, ApiError.openai_response)


@router.get("/health", summary="200 when every pool can serve, 503 while loading or broken")
@router.get("/", summary="Same as /health, at the root where TEI answers it")
async def health(request: Request) -> Response:
    state = _state(request)
    runtime = state.runtime
    if state.startup_error:
        return json_response({"status": "failed", "error": state.startup_error}, 503)
    if runtime is None or not runtime.ready:
        return json_response({"status": "starting"}, 503)
    qm = runtime.queue_manager
    if qm.draining:
        return json_response({"status": "draining"}, 503)
    if not qm.healthy():
        return json_response({"status": "unhealthy", "pools": qm.snapshot()["pools"]}, 503)
    if not qm.all_instances_healthy():
        return json_response({"status": "degraded", "pools": qm.snapshot()["pools"]}, 200)
    return json_response({"status": "ok"})


@router.get("/info", summary="Model, devices, pools, queue depths, SLO, version")
async def info(request: Request) -> Response:
    try:
        check_api_key(request)
    except ApiError as error:
        return error.tei_response()
    state = _state(request)
    settings = state.settings
    runtime = state.runtime
    body = {
        "version": windve.__version__,
        "ready": bool(runtime and runtime.ready),
        "slo_seconds": settings.slo_seconds,
        "max_client_batch_size": settings.max_client_batch_size,
        "max_batch_size": settings.max_batch_size,
        "max_batch_tokens": settings.max_batch_tokens,
    }
    if runtime is not None:
        spec = runtime.spec
        # TEI's /info keys, for clients that read a TEI server's limits from there.
        body.update(
            model_id=spec.name,
            model_sha=spec.revision,
            model_dtype=runtime.dtype,
            model_type={"embedding": {"pooling": spec.pooling}},
            max_input_length=runtime.tokenizer.max_tokens,
            auto_truncate=settings.truncate,
        )
        body["model"] = {
            "id": spec.name,
            "revision": spec.revision,
            "dim": spec.dim,
            "max_input_length": runtime.tokenizer.max_tokens,
            "pooling": spec.pooling,
            "normalize": spec.normalize,
            "engine": settings.engine,
            "dtype": runtime.dtype,
        }
        body.update(runtime.info())
    return json_response(body)


@router.get("/metrics", summary="Prometheus metrics")
async def prometheus_metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
