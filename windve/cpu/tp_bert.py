"""One rank's shard of a BERT-family encoder (BERT, RoBERTa, XLM-R) and its forward pass
(Megatron-style split).

Rank r of G holds heads [r*h, (r+1)*h) of every attention block (h = heads / G: its rows
of Wq/Wk/Wv, fused into one matmul, and the matching input columns of the attention
output projection) and a 1/G slice of the MLP (rows of the up-projection, input columns
of the down-projection). Embeddings and LayerNorms are replicated. Each rank's output
projections produce a partial sum over its heads / MLP slice; `all_reduce` adds them up
(twice per layer, the only synchronisation), and the biases of those two projections
are added once, after the reduce. Every rank then holds the same activations.

Weights are sliced straight out of the safetensors files, so a rank reads and allocates
(first-touches, on its bound NUMA node) only its own shard.

After the encoder every rank applies the model's sentence-transformers head (pooling, Dense
layers: windve.engines.head, read from the folder's modules.json like the other engines);
it is small and replicated, so the ranks need no further exchange.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open

from windve.cpu.bert_shapes import BertShapes, check_tp_degree, read_bert_shapes
from windve.engines.head import SentenceHead
from windve.model import read_pipeline

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
AllReduce = Callable[[torch.Tensor], torch.Tensor]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


class _Weights:
    """Tensor (or a slice of it) by HF name, from whichever safetensors file holds it."""

    def __init__(self, model_dir: Path, dtype: torch.dtype) -> None:
        self._dtype = dtype
        self._handles = [
            safe_open(str(path), framework="pt") for path in sorted(model_dir.glob("*.safetensors"))
        ]
        self._where: dict[str, tuple] = {}
        for handle in self._handles:
            for key in handle.keys():  # noqa: SIM118 (a safe_open handle is not a mapping)
                # *For* task checkpoints prefix the encoder with the family's name
                self._where[key.removeprefix("bert.").removeprefix("roberta.")] = (handle, key)

    def get(self, name: str, rows: slice = slice(None), cols: slice | None = None) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"weight {name!r} not found in the model's safetensors files")
        handle, key = self._where[name]
        sliced = handle.get_slice(key)
        tensor = sliced[rows] if cols is None else sliced[rows, cols]
        return tensor.to(self._dtype).contiguous()


@dataclass
class _Layer:
    qkv_weight: torch.Tensor  # [3 * h * d, hidden]
    qkv_bias: torch.Tensor
    attn_out_weight: torch.Tensor  # [hidden, h * d]: input columns of this rank's heads
    attn_out_bias: torch.Tensor  # full, added after the reduce
    attn_norm: tuple[torch.Tensor, torch.Tensor]
    up_weight: torch.Tensor  # [intermediate / G, hidden]
    up_bias: torch.Tensor
    down_weight: torch.Tensor  # [hidden, intermediate / G]
    down_bias: torch.Tensor
    out_norm: tuple[torch.Tensor, torch.Tensor]


class ShardedBert:
    def __init__(
        self,
        model_dir: Path,
        rank: int,
        world: int,
        all_reduce: AllReduce,
        pooling: str | None = None,
        dtype: str = "fp32",
    ) -> None:
        """`pooling`: the caller's ModelSpec.pooling, checked against the folder's (None: not checked)."""
        self.shapes: BertShapes = read_bert_shapes(model_dir)
        check_tp_degree(self.shapes, world)
        self.rank, self.world = rank, world
        pipeline = read_pipeline(Path(model_dir))
        if pooling is not None and pooling != pipeline.pooling:
            raise ValueError(f"pooling {pooling!r} differs from the model folder's {pipeline.pooling!r}")
        self.head = SentenceHead(Path(model_dir), pipeline.pooling, pipeline.dense)
        self.dim = pipeline.dim
        self.dtype = TORCH_DTYPES[dtype]
        self._all_reduce = all_reduce
        self._activation = _ACTIVATIONS[self.shapes.activation]
        weights = _Weights(Path(model_dir), self.dtype)
        self._load_embeddings(weights)
        self.layers = [self._load_layer(weights, index) for index in range(self.shapes.layers)]

    def _load_embeddings(self, weights: _Weights) -> None:
        self.word_embeddings = weights.get("embeddings.word_embeddings.weight")
        self.position_embeddings = weights.get("embeddings.position_embeddings.weight")
        # The engines send no token_type_ids: every token is type 0, as in HF's default.
        self.type_embedding = weights.get("embeddings.token_type_embeddings.weight", slice(0, 1))[0]
        self.embed_norm = (
            weights.get("embeddings.LayerNorm.weight"),
            weights.get("embeddings.LayerNorm.bias"),
        )

    def _load_layer(self, weights: _Weights, index: int) -> _Layer:
        s, rank, world = self.shapes, self.rank, self.world
        prefix = f"encoder.layer.{index}."
        width = s.heads // world * s.head_dim
        heads = slice(rank * width, (rank + 1) * width)
        mlp = slice(rank * s.intermediate // world, (rank + 1) * s.intermediate // world)
        qkv = [prefix + f"attention.self.{part}" for part in ("query", "key", "value")]
        return _Layer(
            qkv_weight=torch.cat([weights.get(name + ".weight", heads) for name in qkv]),
            qkv_bias=torch.cat([weights.get(name + ".bias", heads) for name in qkv]),
            attn_out_weight=weights.get(prefix + "attention.output.dense.weight", slice(None), heads),
            attn_out_bias=weights.get(prefix + "attention.output.dense.bias"),
            attn_norm=(
                weights.get(prefix + "attention.output.LayerNorm.weight"),
                weights.get(prefix + "attention.output.LayerNorm.bias"),
            ),
            up_weight=weights.get(prefix + "intermediate.dense.weight", mlp),
            up_bias=weights.get(prefix + "intermediate.dense.bias", mlp),
            down_weight=weights.get(prefix + "output.dense.weight", slice(None), mlp),
            down_bias=weights.get(prefix + "output.dense.bias"),
            out_norm=(
                weights.get(prefix + "output.LayerNorm.weight"),
                weights.get(prefix + "output.LayerNorm.bias"),
            ),
        )

    def _norm(self, x: torch.Tensor, params: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.layer_norm(x, (self.shapes.hidden,), params[0], params[1], self.shapes.eps)

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(partial) if self.world > 1 else partial

    def _positions(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """Position embeddings, [L, hidden] for BERT or [B, L, hidden] for the RoBERTa family."""
        s = self.shapes
        if s.first_position == 0:
            return self.position_embeddings[: attention_mask.shape[1]]
        # As HF's RoBERTa: tokens count up from padding_idx + 1, padding sits at padding_idx.
        mask = attention_mask.long()
        return F.embedding(torch.cumsum(mask, dim=1) * mask + s.pad_id, self.position_embeddings)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """int64 [B, L] ids and 0/1 mask -> last hidden state [B, L, hidden]."""
        batch, length = input_ids.shape
        s = self.shapes
        x = F.embedding(input_ids, self.word_embeddings) + self._positions(attention_mask) + self.type_embedding
        x = self._norm(x, self.embed_norm)
        # Padded keys are masked out; with no padding at all, no mask (the faster kernel).
        keep = None if bool(attention_mask.all()) else attention_mask.bool()[:, None, None, :]
        heads = s.heads // self.world
        for layer in self.layers:
            qkv = F.linear(x, layer.qkv_weight, layer.qkv_bias)
            q, k, v = qkv.view(batch, length, 3, heads, s.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            context = context.transpose(1, 2).reshape(batch, length, heads * s.head_dim)
            attended = self._reduce(F.linear(context, layer.attn_out_weight))
            x = self._norm(attended + layer.attn_out_bias + x, layer.attn_norm)
            inner = self._activation(F.linear(x, layer.up_weight, layer.up_bias))
            mixed = self._reduce(F.linear(inner, layer.down_weight))
            x = self._norm(mixed + layer.down_bias + x, layer.out_norm)
        return x

    def embed(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The Engine contract: int64 [B, L] -> float32 [B, dim] through the head, not normalized."""
        mask = torch.from_numpy(attention_mask)
        return self.head(self.forward(torch.from_numpy(input_ids), mask), mask).numpy()
