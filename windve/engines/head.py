"""The part of a sentence-transformers pipeline after the encoder, shared by every engine:
Pooling, then the Dense layers (windve.model reads both from modules.json).

Normalize is not applied here: engines return the pre-normalization vector and the front end
normalizes when the model or the request asks. The head runs in float32 whatever the
encoder's dtype: it is a few small matmuls, and fp16/bf16 would only add error to them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from windve.engines.pooling import pool
from windve.model import DenseLayer, ModelSpec

Activation = Callable[[torch.Tensor], torch.Tensor]

# windve.model.DENSE_ACTIVATIONS: torch.nn's classes with their defaults, as sentence-transformers builds them.
ACTIVATIONS: dict[str, Activation] = {
    "Identity": lambda x: x,
    "Tanh": torch.tanh,
    "Sigmoid": torch.sigmoid,
    "ReLU": F.relu,
    "GELU": F.gelu,
    "SiLU": F.silu,
    "LeakyReLU": F.leaky_relu,
    "ELU": F.elu,
    "Softplus": F.softplus,
    "Mish": F.mish,
}


class _Dense:
    def __init__(self, model_dir: Path, layer: DenseLayer, device: torch.device) -> None:
        tensors = load_file(str(model_dir / layer.path / "model.safetensors"))
        self.weight = tensors["linear.weight"].to(device, torch.float32)
        self.bias = tensors["linear.bias"].to(device, torch.float32) if layer.bias else None
        self.activation = ACTIVATIONS[layer.activation]
        self.residual = layer.residual
        # A residual across a change of width goes through its own projection.
        projection = tensors.get("residual.weight")
        self.projection = projection.to(device, torch.float32) if self.residual and projection is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(F.linear(x, self.weight, self.bias))
        if not self.residual:
            return out
        return out + (x if self.projection is None else F.linear(x, self.projection))


class SentenceHead:
    """Encoder states [B, L, H] and mask [B, L] -> float32 [B, dim]: pooled, then each Dense layer."""

    def __init__(
        self, model_dir: Path, pooling: str, dense: Sequence[DenseLayer] = (), device: str | torch.device = "cpu"
    ) -> None:
        self.pooling = pooling
        self._layers = [_Dense(Path(model_dir), layer, torch.device(device)) for layer in dense]

    @classmethod
    def from_spec(cls, spec: ModelSpec, device: str | torch.device = "cpu") -> SentenceHead:
        return cls(spec.path, spec.pooling, spec.dense, device)

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        vectors = pool(hidden, attention_mask, self.pooling)
        for layer in self._layers:
            vectors = layer(vectors)
        return vectors

    def apply_numpy(self, hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The same on host arrays (the onnx engine's output), without copying them."""
        return self(torch.from_numpy(hidden), torch.from_numpy(attention_mask)).numpy()
