"""Request and response bodies of the two embedding APIs, and their validation messages."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from windve.frontend.errors import VALIDATION, ApiError


def as_list(texts: str | list[str]) -> list[str]:
    """Both APIs take one text or a list of them."""
    return [texts] if isinstance(texts, str) else texts


_DIMENSIONS = (
    "Matryoshka models: keep the first `dimensions` components (renormalized when the embeddings are "
    "normalized). Allowed: the model's size, and the sizes the model or the setting matryoshka_dims "
    "declare (/info model.dimensions)"
)


class _TeiInputs(BaseModel):
    """The texts of a TEI request, and the prompt to put in front of each."""

    model_config = ConfigDict(extra="ignore")

    inputs: StrictStr | list[StrictStr] = Field(description="One text or a list of texts")
    prompt_name: StrictStr | None = Field(
        None,
        description="One of the model's sentence-transformers prompts (/info model.prompts), put in front of "
        "each input; default: the server's default prompt, else the model's default_prompt_name",
    )

    @property
    def texts(self) -> list[str]:
        return as_list(self.inputs)


class EmbedRequest(_TeiInputs):
    """text-embeddings-inference's `POST /embed`."""

    inputs: StrictStr | list[StrictInt] | list[StrictStr | list[StrictInt]] = Field(  # type: ignore[assignment]
        description="One text or a list of texts; or, as TEI takes them, the model's token ids (one list of "
        "them, or such lists among the texts), embedded as they are: no special tokens are added"
    )
    normalize: StrictBool = Field(True, description="Scale each embedding to unit length")
    truncate: StrictBool | None = Field(
        None, description="Cut inputs longer than the model's limit (default: the server's setting)"
    )
    truncation_direction: StrictStr | None = Field(
        None, description="`right` cuts a long input's end, `left` its start (default: the model's tokenizer's side)"
    )
    dimensions: StrictInt | None = Field(None, description=_DIMENSIONS)

    @field_validator("truncation_direction")
    @classmethod
    def _a_side(cls, value: str | None) -> str | None:
        # TEI spells them Left and Right; clients send either case.
        if value is not None and value.lower() not in ("left", "right"):
            raise ValueError(f"{value!r} is neither 'left' nor 'right'")
        return None if value is None else value.lower()

    @property
    def texts(self) -> list[str | list[int]]:  # type: ignore[override]
        inputs = self.inputs
        one = isinstance(inputs, str) or (bool(inputs) and _is_token_id(inputs[0]))
        return [inputs] if one else inputs  # type: ignore[list-item, return-value]

    @field_validator("inputs", mode="before")
    @classmethod
    def _texts_or_token_ids(cls, value: object) -> object:
        # The union's own errors name its alternatives, not the item that is wrong.
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("must be a text, a list of texts, or token ids")
        if value and all(_is_token_id(item) for item in value):  # one input's token ids
            for index, token in enumerate(value):
                _check_token_id(token, f"[{index}]")
            return value
        for index, item in enumerate(value):
            if isinstance(item, list):
                for inner, token in enumerate(item):
                    _check_token_id(token, f"[{index}][{inner}]")
            elif not isinstance(item, str):
                raise ValueError(f"[{index}] is {_shown(item)}, not a text or a list of token ids")
        return value


class TokenizeRequest(_TeiInputs):
    """text-embeddings-inference's `POST /tokenize`."""

    add_special_tokens: StrictBool = Field(True, description="Include the model's special tokens ([CLS], [SEP])")

    @field_validator("inputs", mode="before")
    @classmethod
    def _texts_not_token_ids(cls, value: object) -> object:
        if _token_ids(value):
            raise ValueError("token ids are not accepted, only texts (/embed takes them; /decode turns them into text)")
        return value


class DecodeRequest(BaseModel):
    """text-embeddings-inference's `POST /decode`: token ids back to text."""

    model_config = ConfigDict(extra="ignore")

    ids: list[StrictInt] | list[list[StrictInt]] = Field(description="One sequence of token ids, or a list of them")
    skip_special_tokens: StrictBool = Field(True, description="Leave out the model's special tokens ([CLS], [SEP])")

    @property
    def sequences(self) -> list[list[int]]:
        ids = self.ids
        return [ids] if not ids or not isinstance(ids[0], list) else ids  # type: ignore[list-item]

    @field_validator("ids", mode="before")
    @classmethod
    def _one_shape(cls, value: object) -> object:
        # The union's own errors name its alternatives ("ids.list[int].0"); say which item is wrong.
        if not isinstance(value, list):
            raise ValueError("must be a list of token ids, or a list of such lists")
        if not value:
            raise ValueError("must not be empty")
        nested = isinstance(value[0], list)
        for index, item in enumerate(value):
            if not nested:
                _check_token_id(item, f"[{index}]")
            elif not isinstance(item, list):
                raise ValueError(f"[{index}] is {_shown(item)}, not a list: nest every sequence or none")
            else:
                for inner, token in enumerate(item):
                    _check_token_id(token, f"[{index}][{inner}]")
        return value


class TeiToken(BaseModel):
    id: int
    text: str = Field(description="The text the token covers, or the special token")
    special: bool
    start: int | None = Field(description="Character offset into the input; null for special tokens")
    stop: int | None


class OpenAIEmbeddingRequest(BaseModel):
    """OpenAI's `POST /v1/embeddings`."""

    model_config = ConfigDict(extra="ignore")

    input: StrictStr | list[StrictStr] = Field(description="One text or a list of texts")
    model: StrictStr | None = Field(None, description="Accepted for compatibility; the served model answers")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, description=_DIMENSIONS)
    user: StrictStr | None = None

    @field_validator("encoding_format", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: object) -> object:
        # As for the other optional fields: clients that write unset fields as null send it so.
        return "float" if value is None else value

    @property
    def texts(self) -> list[str]:
        return as_list(self.input)

    @field_validator("input", mode="before")
    @classmethod
    def _texts_not_token_ids(cls, value: object) -> object:
        # OpenAI also takes token ids (tiktoken's); LangChain's OpenAIEmbeddings sends them by default,
        # and they mean nothing to another model's vocabulary, so say how to send texts instead.
        if _token_ids(value):
            raise ValueError(
                "token ids are not accepted, only texts (LangChain's OpenAIEmbeddings sends token ids "
                "unless check_embedding_ctx_length=False)"
            )
        return value


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_token_id(token: object, where: str) -> None:
    if not _is_token_id(token) or token < 0:  # type: ignore[operator]
        raise ValueError(f"{where} is {_shown(token)}, not a token id (an integer >= 0)")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _token_ids(value: object) -> bool:
    """Whether an input field holds token ids: one list of them, or a list of such lists."""
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(_is_token_id(i) or (isinstance(i, list) and i and _is_token_id(i[0])) for i in items)


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="Unix time the service loaded the model")
    owned_by: str


class OpenAIModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]


class TeiError(BaseModel):
    error: str
    error_type: str


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: OpenAIErrorBody


_ADAPTERS: dict[type, TypeAdapter] = {}


def parse(model: type[BaseModel], data: Any) -> Any:
    """Validate a decoded JSON body; a 422 ApiError names the first wrong field."""
    if not isinstance(data, dict):
        raise ApiError(422, f"request body must be a JSON object, not {type(data).__name__}", VALIDATION)
    adapter = _ADAPTERS.get(model) or _ADAPTERS.setdefault(model, TypeAdapter(model))
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise ApiError(422, describe(exc), VALIDATION, param=_field(exc)) from None


def _field(exc: ValidationError) -> str | None:
    errors = exc.errors()
    return str(errors[0]["loc"][0]) if errors and errors[0]["loc"] else None


def describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    # A union reports each alternative; the list branch names the bad item, which says most.
    for error in exc.errors():
        loc = error["loc"]
        if len(loc) >= 3 and loc[1] == "list[str]":
            return f"{loc[0]}[{loc[2]}]: {error['msg']}"
        if error["type"] == "missing":
            return f"{loc[0]}: field required"
    loc = [str(part) for part in first["loc"] if part not in ("str", "list[str]")]
    message = first["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own message
    if message.startswith("["):  # a validator's message about one item: "inputs[1] is ..."
        return f"{'.'.join(loc)}{message}"
    return f"{'.'.join(loc) or 'body'}: {message}"


def request_schema(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI `requestBody` for a route that reads and validates its body itself."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
