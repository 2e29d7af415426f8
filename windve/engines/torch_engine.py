"""Device-agnostic torch engine: the same code on cpu, cuda:N and npu:N.

The encoder comes from transformers; pooling and the Dense layers are windve.engines.head's.
"""

from __future__ import annotations

import numpy as np
import torch

from windve.engines.head import SentenceHead
from windve.model import ModelSpec

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_encoder(spec: ModelSpec, dtype: str = "fp32", attn: str = "sdpa") -> torch.nn.Module:
    """The transformers encoder in eval mode, weights from safetensors only."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    # Its load report flags the unused pooler head as UNEXPECTED: noise for an embedder.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = AutoModel.from_pretrained(
        spec.path,
        dtype=TORCH_DTYPES[dtype],
        attn_implementation=attn,
        use_safetensors=True,
        trust_remote_code=spec.trust_remote_code,
        add_pooling_layer=False,
    )
    return model.eval()


def prepare_device(device: str) -> torch.device:
    if device.startswith("npu"):
        import torch_npu  # noqa: F401  (registers the "npu" device with torch)
    return torch.device(device)


class TorchEngine:
    def __init__(self, spec: ModelSpec, device: str = "cpu", dtype: str = "fp32") -> None:
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self.dim = spec.dim
        self._device = prepare_device(device)
        self._model = load_encoder(spec, dtype).to(self._device)
        self._head = SentenceHead.from_spec(spec, self._device)

    @torch.inference_mode()
    def embed(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        ids = torch.from_numpy(input_ids).to(self._device, non_blocking=True)
        mask = torch.from_numpy(attention_mask).to(self._device, non_blocking=True)
        hidden = self._model(input_ids=ids, attention_mask=mask).last_hidden_state
        return self._head(hidden, mask).cpu().numpy()
