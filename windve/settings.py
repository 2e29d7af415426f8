"""Every knob of the service, read once at the edge and passed down as plain values.

Sources, highest priority first: CLI flags of `windve serve`, environment variables
`WINDVE_<NAME>`, a YAML/JSON config file (`--config` / `WINDVE_CONFIG`), defaults.
"""

from __future__ import annotations

import json
import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

# An Origin header's value (RFC 6454): scheme, host, optional port; no path, not even "/".
_ORIGIN = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s?#]+")


class SettingsError(ValueError):
    """Invalid settings: the message names each offending setting."""


class InstanceConfig(BaseModel):
    """One instance of an explicit device plan (config file `plan:` list)."""

    model_config = {"extra": "forbid"}

    pool: Literal["accelerator", "cpu"]
    # Shown in /info and the engines' metric labels; default <pool>-<index within the pool>.
    name: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    device: str = "cpu"  # cpu | cuda:N | npu:N
    cores: list[int] = Field(default_factory=list)
    tp: int = 1
    engine: Literal["torch", "onnx"] | None = None
    threads: int | None = None


def check_redis_url(url: str) -> None:
    """ValueError saying what is wrong with `url` as a Redis URL (its password not repeated)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("a Redis URL starts with redis://, rediss:// (TLS) or unix://")
    from redis.connection import parse_url

    try:
        parse_url(url)
    except ValueError as error:  # a port that is not a number, an option of the wrong type
        raise ValueError(f"not a Redis URL: {error}") from None


class Settings(BaseSettings):
    # An empty variable is an unset one: templates (compose's ${VAR}, a chart's extraEnv) write
    # empty values for settings left alone, which had meant "no cores reserved", a model named "",
    # a calibration file "." or a refused start.
    model_config = SettingsConfigDict(
        env_prefix="WINDVE_", extra="forbid", validate_default=True, env_nested_delimiter="__", env_ignore_empty=True
    )

    # HTTP
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    api_key: str | None = None
    max_client_batch_size: int = Field(2048, ge=1)  # inputs per request (OpenAI's limit)
    max_request_bytes: int = Field(2 * 1024 * 1024, ge=1024)
    max_tokenize_tokens: int = Field(131_072, ge=64)  # tokens one /tokenize request may return
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Origins whose pages may call the API from a browser (CORS): "*" = any, as TEI, vLLM and
    # Infinity allow by default; [] = none. Each as a browser sends it: scheme://host[:port].
    cors_allow_origins: Annotated[list[str], NoDecode] = ["*"]
    # Front-end processes (HTTP, validation, tokenization). None = from the reserved service
    # cores: 1 where one process is fastest (small machines).
    http_workers: int | None = Field(None, ge=1, le=64)
    # Niceness of front-end work (HTTP, tokenization, answering BUSY) on cores shared with
    # engines, so that a storm of refusals does not take the engines' CPU. 0 = off. None = 10
    # for one process (the dispatcher inside it), 0 for front ends beside a dispatcher of their
    # own, whose answers a niced loop held for 0.4 s under a storm (bench/SERVED.md).
    frontend_nice: int | None = Field(None, ge=0, le=19)

    # Model
    model: str | None = None  # local folder or model id; None = bundled all-MiniLM-L6-v2
    revision: str | None = None
    trust_remote_code: bool = False
    engine: Literal["torch", "onnx"] = "torch"
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    onnx_cache_dir: Path = Path(os.path.expanduser("~/.cache/windve/onnx"))
    truncate: bool = True  # default for requests that do not say
    max_input_tokens: int | None = Field(None, ge=8)  # cap below the model's own limit
    matryoshka_dims: list[int] | None = None  # dimensions `dimensions` may ask for; None = the model's
    # Put in front of every input of a request that names no prompt (TEI's flags of these names):
    # one of the model's prompts by name, or a text. Neither: the model's default_prompt_name, if any.
    default_prompt_name: str | None = None
    default_prompt: str | None = None

    # Batching and queueing
    max_batch_size: int = Field(32, ge=1)  # CPU pool: queries per batch
    max_batch_tokens: int = Field(16384, ge=64)  # CPU pool: padded tokens per batch
    # Accelerator pool: batches bounded by a token budget (TEI's default), sized for the device.
    accelerator_max_batch_size: int = Field(1024, ge=1)
    accelerator_max_batch_tokens: int = Field(16384, ge=64)
    # Batches an accelerator engine holds: one computing, the rest formed and waiting in its pipe.
    # More hide a busier dispatcher's turns (bench/handoff.py), each at one batch's latency.
    accelerator_pipeline: int = Field(2, ge=1, le=8)
    slo_seconds: float = Field(1.0, gt=0)
    heterogeneous: bool = True
    accelerator_depth: int | None = Field(None, ge=1)  # queries; None = calibration or default
    cpu_depth: int | None = Field(None, ge=1)
    calibration_file: Path | None = None
    # adaptive: the dispatcher refits latency = alpha*C + beta from live answers and moves each
    # depth toward the SLO crossing; static: the paper's fixed depths.
    depth_control: Literal["adaptive", "static"] = "adaptive"
    depth_cap: float = Field(2.0, ge=1.0)  # adaptive depth <= calibrated or probed depth x this
    bulk_share: float = Field(0.5, gt=0, le=1)  # share of a pool's depth that bulk requests may hold
    heartbeat_timeout_seconds: float = Field(5.0, gt=0)  # an engine process silent this long = dead
    # A serving front end whose event loop is silent this long = stalled. Looser than an engine's:
    # on two cores shared by four niced front ends, engines and wrk, loops went 1-3 s unscheduled
    # at 10x the depth (bench/SERVED.md), and a false kill drops every connection it holds.
    frontend_heartbeat_timeout_seconds: float = Field(30.0, gt=0)
    # A front end that does not serve this long after its start (imports, the tokenizer, its link
    # to the dispatcher) = hung: the connections the kernel hashes to its socket would wait for ever.
    frontend_start_timeout_seconds: float = Field(120.0, gt=0)

    # Devices
    device: Literal["auto", "cpu", "cuda", "npu"] = "auto"
    sysfs_root: Path = Path("/sys")
    reserved_cores: list[int] | None = None  # None = the detector's rule
    cpu_layout: Literal["per-node", "tp", "explicit"] = "per-node"
    plan: list[InstanceConfig] | None = None  # explicit plan, normally from the config file

    # State
    redis_url: str | None = None
    cache_size: int = Field(100_000, ge=0)  # in-process entries (an L1 of at most 10_000 with Redis); 0 = off
    cache_ttl_seconds: int = Field(7 * 24 * 3600, ge=1)
    redis_timeout_seconds: float = Field(0.05, gt=0)

    @field_validator("reserved_cores", mode="before")
    @classmethod
    def _cores_from_text(cls, value: Any) -> Any:
        # WINDVE_RESERVED_CORES=3 reaches here as the number 3: the settings library reads a list's
        # variable as JSON first, and a single CPU is valid JSON.
        if isinstance(value, int) and not isinstance(value, bool):
            return [value]
        if isinstance(value, str):
            from devices.cpulist import parse_cpulist

            return sorted(parse_cpulist(value))
        return value

    @field_validator("matryoshka_dims", mode="before")
    @classmethod
    def _dims_from_text(cls, value: Any) -> Any:
        # As written by hand: `256` (which the env's JSON reading makes a number) or `256,128`.
        if isinstance(value, int) and not isinstance(value, bool):
            return [value]
        if isinstance(value, str) and value.strip() and not value.lstrip().startswith("["):
            return [piece.strip() for piece in value.split(",")]  # each validated as an int
        return value

    @field_validator("cors_allow_origins", mode="before")
    @classmethod
    def _origins_from_text(cls, value: Any) -> Any:
        # As written by hand: `*` or `https://a.example,https://b.example`; or a JSON list (`[]`: none).
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                raise ValueError("not a JSON list of origins") from None
        if isinstance(value, str):
            return [piece.strip() for piece in value.split(",") if piece.strip()]
        return value

    @field_validator("cors_allow_origins")
    @classmethod
    def _origins_as_sent(cls, value: list[str]) -> list[str]:
        for origin in value:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin: write it as a browser sends it, scheme://host[:port] "
                    "with no path or trailing slash (or * for any)"
                )
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value  # DEBUG, as Python's logging names it

    @field_validator("redis_url", mode="before")
    @classmethod
    def _redis_scheme(cls, value: Any) -> Any:
        # Checked here, not where the cache first connects: a start that fails there had already
        # loaded the engines, and its message named no setting.
        if value == "":
            return None
        if isinstance(value, str):
            check_redis_url(value)
        return value

    @model_validator(mode="after")
    def _one_default_prompt(self) -> Settings:
        if self.default_prompt_name is not None and self.default_prompt is not None:
            raise ValueError("set default_prompt_name or default_prompt, not both")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _ConfigFileSource(settings_cls))


# The file `--config` names, for the Settings being built now. Not exported to os.environ: a process
# that loads settings from a file must not hand that file to every child it starts afterwards.
_config_file: ContextVar[Path | None] = ContextVar("windve_config_file", default=None)


class _ConfigFileSource(PydanticBaseSettingsSource):
    """Reads the file `--config` names, else the one WINDVE_CONFIG names (YAML or JSON; JSON is YAML)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = _config_file.get() or os.environ.get("WINDVE_CONFIG")
        return read_config_file(Path(path)) if path else {}


def read_config_file(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SettingsError(f"config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise SettingsError(f"config file {path} is not valid YAML/JSON: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold a mapping of settings")
    return {key.replace("-", "_"): value for key, value in data.items()}


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build settings from all sources; raise SettingsError naming each bad setting."""
    given = {key: value for key, value in overrides.items() if value is not None}
    token = _config_file.set(Path(config_file) if config_file is not None else None)
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise SettingsError(describe_validation_error(exc, given, _config_file.get())) from None
    finally:
        _config_file.reset(token)


SECRET_SETTINGS = frozenset({"api_key", "redis_url"})  # values an error message does not repeat


def describe_validation_error(
    exc: ValidationError, given: dict[str, Any] | None = None, config_file: Path | None = None
) -> str:
    """One line per bad setting, naming where its value came from: `given` (flags), the
    environment, or the config file, in that order of precedence."""
    lines = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"]) or "settings"
        value = error.get("input")
        shown = f" (got {value!r})" if not isinstance(value, dict) and value is not None else ""
        if name in SECRET_SETTINGS:
            shown = ""  # a password in a Redis URL, an API key: not for the log
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":  # only a file (or a caller) names a setting there is none of
            lines.append(f"unknown setting {name}: no such setting (`windve serve --help` lists them)")
            continue
        field = str(error["loc"][0]) if error["loc"] else ""
        lines.append(f"invalid setting {name} ({_source(field, given or {}, config_file)}): {message}{shown}")
    return "\n".join(lines)


def _source(field: str, given: dict[str, Any], config_file: Path | None) -> str:
    env = f"WINDVE_{field.upper()}"
    if field in given:
        return f"flag --{field.replace('_', '-')}"
    if os.environ.get(env):
        return f"env {env}"
    path = config_file or os.environ.get("WINDVE_CONFIG")
    return f"config file {path}" if path else f"env {env}"
