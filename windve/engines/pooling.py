"""Pooling of token states into one vector per text, as sentence-transformers' Pooling does it.

Modes: cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken, or several joined by
"+" and concatenated in that order (windve.model.POOLING_MODES). Like sentence-transformers,
"first" and "last" token follow the mask, so left padding would pool the same as right.
Sums accumulate in float32 whatever the encoder's dtype; the result is float32.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

PoolFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """[B, L, H] states and [B, L] 0/1 mask -> [B, H * modes] float32."""
    vectors = [_MODES[mode](hidden, attention_mask) for mode in pooling.split("+")]
    return vectors[0] if len(vectors) == 1 else torch.cat(vectors, dim=-1)


def _gather(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """hidden[b, index[b]] for every row b."""
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]


def _cls(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return _gather(hidden, mask.argmax(dim=1)).float()


def _last_token(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    last = mask.shape[1] - 1 - mask.flip(1).argmax(dim=1)
    # A row without any token pools to zeros, as in sentence-transformers.
    return (_gather(hidden, last) * _gather(mask, last).unsqueeze(-1)).float()


def _max(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return hidden.masked_fill(mask.unsqueeze(-1) == 0, float("-inf")).amax(dim=1).float()


def _masked_sum(hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * weights).sum(dim=1, dtype=torch.float32)
    return summed, mask.sum(dim=1, keepdim=True, dtype=torch.float32).clamp(min=1e-9)


def _mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    summed, count = _masked_sum(hidden, mask)
    return summed / count


def _mean_sqrt_len(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    summed, count = _masked_sum(hidden, mask)
    return summed / count.sqrt()


def _weighted_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Token i of a text weighs i + 1, counted from its first real token.
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device, dtype=torch.float32)
    weights = (positions - mask.argmax(dim=1, keepdim=True)) * mask
    summed = (hidden.float() * weights.unsqueeze(-1)).sum(dim=1)
    return summed / weights.sum(dim=1, keepdim=True).clamp(min=1e-9)


_MODES: dict[str, PoolFn] = {
    "cls": _cls,
    "max": _max,
    "mean": _mean,
    "mean_sqrt_len_tokens": _mean_sqrt_len,
    "weightedmean": _weighted_mean,
    "lasttoken": _last_token,
}
