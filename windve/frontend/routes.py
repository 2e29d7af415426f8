"""HTTP routes: /embed, /tokenize and /decode (TEI shape), /v1/embeddings and /v1/models (OpenAI shape),
/health, /info, /metrics.

`POST /` answers as /embed and `GET /` as /health, as TEI's do for an embedding model
(huggingface_hub's InferenceClient posts there); /embeddings and /models answer as their /v1
twins, where Infinity serves them by default.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.datastructures import State
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

import windve
from windve.frontend import metrics
from windve.frontend.auth import check_api_key
from windve.frontend.body import read_json
from windve.frontend.dimensions import allowed_dimensions, cut, requested_dimensions
from windve.frontend.errors import MODEL_NOT_FOUND, ApiError, json_response
from windve.frontend.exposition import combined_metrics
from windve.frontend.pipeline import BUSY_ANSWERED, ClientGone, EmbeddingPipeline, arrival, counted
from windve.frontend.schemas import (
    DecodeRequest,
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
from windve.frontend.timing_headers import timing_headers
from windve.frontend.tokenize_limits import decode_within_limits, tokenize_within_limits

router = APIRouter()


def get_and_head(path: str, **options: Any) -> Callable[[Callable], Callable]:
    """router.get, answering HEAD too (RFC 9110 9.1: load balancers and uptime checks probe with
    it), as Starlette's own routes do and FastAPI's do not. The HEAD route stays out of the OpenAPI
    document, where it would repeat the GET operation's id."""

    def register(endpoint: Callable) -> Callable:
        router.add_api_route(path, endpoint, methods=["GET"], **options)
        router.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)
        return endpoint

    return register

BodyModel = TypeVar("BodyModel", bound=BaseModel)

CLIENT_CLOSED = 499  # nginx's code: nobody reads it, but logs and metrics say what happened
MODEL_PATHS = ("/v1/models/", "/models/")  # where one model is looked up by id

_TEI_ERRORS = {code: {"model": TeiError} for code in (401, 413, 415, 422, 429, 503)}
_OPENAI_ERRORS = {code: {"model": OpenAIError} for code in (400, 401, 413, 415, 429, 503)}
_MODELS_ERRORS = {code: {"model": OpenAIError} for code in (401, 503)}


def _state(request: Request):
    return request.app.state


async def _request_body(request: Request, model: type[BodyModel]) -> BodyModel:
    """The JSON body, within the size limit, validated as `model` (a 413 or 422 ApiError if not)."""
    return parse(model, await read_json(request, _state(request).settings.max_request_bytes))


def _characters(texts: list) -> int:
    return sum(len(text) for text in texts if isinstance(text, str))  # token ids are no characters


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
    # From the request's arrival (http_protocol.py stamps it), as its client and depth control count
    # it: under load a handler starts an event-loop turn or more after its bytes came.
    started = arrival(request.scope)
    status = 200
    try:
        check_api_key(request)
        return await handle()
    except ApiError as error:
        if counted(request):
            metrics.ERRORS.labels(route, error.error_type).inc()
        response = error_shape(error)
        status = response.status_code  # the status sent: OpenAI's shape answers 400 where TEI's says 422
        if status == 429:
            request.scope[BUSY_ANSWERED] = True
        return response
    except (ClientGone, ClientDisconnect):  # gone while it waited, or while its body was read
        status = CLIENT_CLOSED
        return Response(status_code=CLIENT_CLOSED)
    finally:
        if counted(request):  # not the warm-up probe's: the clients' metrics start with the clients
            metrics.REQUESTS.labels(route, str(status)).inc()
            # Refusals and errors are counted above; as latencies they would hide the answers'. Model
            # lists and /tokenize are not the SLO's: their instant 200s would dilute it.
            if status == 200 and route in TIMED_ROUTES:  # (defined below, with the routes)
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
        pipeline = _pipeline(request)
        dimensions = requested_dimensions(body.dimensions, pipeline.runtime.spec, _state(request).settings)
        embedded = await pipeline.embed(
            body.texts, body.normalize, body.truncate, request, "inputs", body.prompt_name, body.truncation_direction
        )
        return json_response(
            cut(embedded.vectors, dimensions, renormalize=body.normalize),
            headers=timing_headers(embedded, arrival(request.scope), _characters(body.texts)),
        )

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
        state = _state(request)
        answer = await tokenize_within_limits(
            pipeline.runtime.tokenizer,
            pipeline.prompted(body.texts, body.prompt_name),
            body.add_special_tokens,
            state.settings.max_tokenize_tokens,
            state.tokenize_budget,
        )
        return Response(answer, media_type="application/json")

    return await _answered(request, "tokenize", handle, ApiError.tei_response)


@router.post(
    "/decode",
    summary="The text of token ids, as the model's tokenizer decodes them (text-embeddings-inference shape)",
    response_model=list[str],
    responses=_TEI_ERRORS,
    openapi_extra=request_schema(DecodeRequest),
)
async def decode(request: Request) -> Response:
    async def handle() -> Response:
        settings = _state(request).settings
        data = await read_json(request, settings.max_request_bytes)
        tokenizer = _pipeline(request).runtime.tokenizer
        answer = await decode_within_limits(
            tokenizer, data, settings.max_tokenize_tokens, settings.max_client_batch_size
        )
        return Response(answer, media_type="application/json")

    return await _answered(request, "decode", handle, ApiError.tei_response)


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
        dimensions = requested_dimensions(body.dimensions, spec, _state(request).settings)
        embedded = await pipeline.embed(body.texts, spec.normalize, None, request, "input")
        vectors, tokens = cut(embedded.vectors, dimensions, renormalize=spec.normalize), embedded.tokens
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
            },
            headers=timing_headers(embedded, arrival(request.scope), _characters(body.texts)),
        )

    return await _answered(request, "openai", handle, ApiError.openai_response)


def _served_model(request: Request) -> dict:
    """The OpenAI model object of the one model this service serves."""
    pipeline = _pipeline(request)
    return OpenAIModel(
        id=pipeline.runtime.spec.name, created=_state(request).ready_since, owned_by="windve"
    ).model_dump()


@get_and_head("/v1/models", summary="The served model (OpenAI models shape)",
              response_model=OpenAIModelList, responses=_MODELS_ERRORS)
@get_and_head("/models", summary="Same as /v1/models, at Infinity's default path",
              response_model=OpenAIModelList, responses=_MODELS_ERRORS)
async def openai_models(request: Request) -> Response:
    async def handle() -> Response:
        return json_response({"object": "list", "data": [_served_model(request)]})

    return await _answered(request, "models", handle, ApiError.openai_response)


_MODEL_ROUTE = {
    "response_model": OpenAIModel,
    "responses": {**_MODELS_ERRORS, 404: {"model": OpenAIError}},
}


@get_and_head("/v1/models/{model_id:path}",
              summary="One model by id (OpenAI shape); 404 for any but the served one", **_MODEL_ROUTE)
@get_and_head("/models/{model_id:path}",
              summary="Same as /v1/models/{model_id}, at Infinity's default path", **_MODEL_ROUTE)
async def openai_model(request: Request, model_id: str) -> Response:
    return await model_by_id(request, model_id)


async def model_by_id(request: Request, model_id: str) -> Response:
    """The served model's object if `model_id` names it, else OpenAI's 404 model_not_found."""

    async def handle() -> Response:
        model = _served_model(request)
        if model_id != model["id"]:
            raise ApiError(
                404, f"the model {model_id!r} does not exist here; this service serves {model['id']!r}",
                MODEL_NOT_FOUND, param="model",
            )
        return json_response(model)

    return await _answered(request, "models", handle, ApiError.openai_response)


HEALTH_PATHS = ("/health", "/")  # GET / is /health too, as TEI answers it


@get_and_head("/health", summary="200 when every pool can serve, 503 while loading or broken")
@get_and_head("/", summary="Same as /health, at the root where TEI answers it")
async def health(request: Request) -> Response:
    """From the dispatcher's board (or its in-process state): never waits behind embedding work.
    Under uvicorn the HTTP protocol answers it before this route (http_protocol.py), alike."""
    body, status = health_answer(_state(request))
    return json_response(body, status)


def health_answer(state: State) -> tuple[dict, int]:
    """/health's body and status from the app's state (app.state)."""
    if state.startup_error:
        return {"status": "failed", "error": state.startup_error}, 503
    if state.runtime is None:
        return {"status": "starting"}, 503
    status = state.runtime.dispatcher.status()
    return status, 200 if status["status"] in ("ok", "degraded") else 503


@get_and_head("/info", summary="Model, devices, pools, queue depths, SLO, version")
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
        "max_tokenize_tokens": settings.max_tokenize_tokens,
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
            "tokenizer_fast_path": runtime.tokenizer.fast_path,
            "pooling": spec.pooling,
            "normalize": spec.normalize,
            "engine": settings.engine,
            "dtype": runtime.dtype,
            "dimensions": list(allowed_dimensions(spec, settings)),
            "prompts": dict(spec.prompts),
            "default_prompt": state.pipeline.default_prompt if state.pipeline is not None else None,
        }
        try:
            body.update(await runtime.dispatcher.info())
        except (asyncio.TimeoutError, OSError) as error:
            body["dispatcher_error"] = f"the dispatcher did not answer: {error or type(error).__name__}"
    return json_response(body)


@get_and_head("/metrics", summary="Prometheus metrics")
async def prometheus_metrics(request: Request) -> Response:
    front_end = _state(request).runtime
    dispatcher_text = b""
    if front_end is not None:
        try:
            dispatcher_text = await front_end.dispatcher.metrics_text()
        except (asyncio.TimeoutError, OSError):
            pass  # the front end's own metrics still answer while the dispatcher is busy or gone
    return Response(combined_metrics(dispatcher_text), media_type=CONTENT_TYPE_LATEST)


# The embedding routes, by path, for the overload gate to call without the framework's routing,
# dependency solving and middleware: a sixth of a front end's CPU per request, where front ends set
# the service's rate (bench/SERVED.md). The routes above stay for every other caller and the schema;
# the paths are read from them, so that a path added there is called straight too.
EMBEDDING_ROUTES = {embed: "embed", openai_embeddings: "openai"}  # endpoint -> its metric label (route)
TIMED_ROUTES = frozenset(EMBEDDING_ROUTES.values())  # the labels windve_request_seconds times
DIRECT_ROUTES: dict[str, Callable[[Request], Awaitable[Response]]] = {
    route.path: route.endpoint
    for route in router.routes
    if isinstance(route, APIRoute) and "POST" in route.methods and route.endpoint in EMBEDDING_ROUTES
}
