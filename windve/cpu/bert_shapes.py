"""What tensor parallelism needs to know about a BERT-family model, read from config.json.

BERT and the RoBERTa family (RoBERTa, XLM-R, CamemBERT) share the encoder; they differ in how
positions are numbered: RoBERTa counts them from padding_idx + 1, so its first usable position
embedding is `pad_token_id + 1` and it has that many fewer positions for tokens.

Torch-free, so the instance can refuse an impossible layout before it spawns anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from windve.model import ROBERTA_FAMILY, first_position, pad_token_id


class TensorParallelError(ValueError):
    """The model cannot be split the way the plan asks."""


SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")
SUPPORTED_MODEL_TYPES = ("bert", *ROBERTA_FAMILY)


@dataclass(frozen=True)
class BertShapes:
    hidden: int
    heads: int
    intermediate: int
    layers: int
    activation: str
    eps: float
    vocab: int
    max_positions: int
    pad_id: int
    first_position: int = 0  # index of the first token's position embedding

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def max_tokens(self) -> int:
        """The longest sequence the position embeddings cover."""
        return self.max_positions - self.first_position


def read_bert_shapes(model_dir: Path) -> BertShapes:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    kind = config.get("model_type", "bert")
    if kind not in SUPPORTED_MODEL_TYPES:
        raise TensorParallelError(
            f"tensor parallelism supports BERT-family encoders (model_type one of "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}), not {kind!r}"
        )
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise TensorParallelError(
            f"tensor parallelism supports absolute position embeddings, not "
            f"{config['position_embedding_type']!r}"
        )
    activation = config.get("hidden_act", "gelu")
    if activation not in SUPPORTED_ACTIVATIONS:
        raise TensorParallelError(f"tensor parallelism: unsupported activation {activation!r}")
    shapes = BertShapes(
        hidden=int(config["hidden_size"]),
        heads=int(config["num_attention_heads"]),
        intermediate=int(config["intermediate_size"]),
        layers=int(config["num_hidden_layers"]),
        activation=activation,
        eps=float(config.get("layer_norm_eps", 1e-12)),
        vocab=int(config["vocab_size"]),
        max_positions=int(config.get("max_position_embeddings", 512)),
        pad_id=pad_token_id(config),
        first_position=first_position(config),
    )
    if shapes.layers < 1:
        raise TensorParallelError("tensor parallelism needs at least one encoder layer")
    return shapes


def check_tp_degree(shapes: BertShapes, world: int) -> None:
    """Heads are the unit of the attention split: G must divide the head count."""
    if world < 1:
        raise TensorParallelError(f"tensor-parallel degree must be >= 1, got {world}")
    if shapes.heads % world:
        raise TensorParallelError(
            f"tensor-parallel degree {world} does not divide the model's {shapes.heads} attention "
            f"heads; use a degree that divides {shapes.heads}"
        )
    if shapes.intermediate < world:
        raise TensorParallelError(
            f"tensor-parallel degree {world} exceeds the MLP width {shapes.intermediate}"
        )
