"""Pooling of token states into one vector per text, as sentence-transformers does it."""

from __future__ import annotations

import torch


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """[B, L, H] states -> [B, H] float32, mean over real tokens or the CLS token."""
    if pooling == "cls":
        return hidden[:, 0].float()
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * mask).sum(dim=1).float()
    counts = mask.sum(dim=1).float().clamp(min=1e-9)
    return summed / counts
