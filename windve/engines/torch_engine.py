"""Device-agnostic torch engine: the same code on cpu, cuda:N and npu:N.

The encoder comes from transformers; pooling and the Dense layers are windve.engines.head's.

On accelerators a batch is padded to a multiple of SHAPE_STEP rows and tokens. The queue manager
forms batches of any size and length, and on a GPU the first forward at a shape not met before
costs more than the next ones. Measured on an H100 (bench/launch.py, bench/SERVED.md): 51-78 ms
more with cuDNN's attention, which builds a graph per shape (so prepare_device turns it off), and
6-13 ms more without it. Steps of 8 bound the shapes to (queries / 8) x (tokens / 8) and waste at
most 7 rows and 7 tokens of arithmetic. CPUs pay nothing for a new shape, so CPU batches keep
their exact shape.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from windve.engines.head import SentenceHead
from windve.model import ModelSpec

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SHAPE_STEP = 8


def bucketed(input_ids: np.ndarray, attention_mask: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch padded to multiples of `step` rows and tokens; the caller keeps the first rows.

    Padding tokens are masked out. A padding row attends to its first token only: a row with
    nothing to attend to would turn its softmax into NaNs, harmless but noisy in a debugger."""
    rows, tokens = input_ids.shape
    want_rows, want_tokens = -(-rows // step) * step, -(-tokens // step) * step
    if (want_rows, want_tokens) == (rows, tokens):
        return input_ids, attention_mask
    ids = np.zeros((want_rows, want_tokens), dtype=input_ids.dtype)
    mask = np.zeros((want_rows, want_tokens), dtype=attention_mask.dtype)
    ids[:rows, :tokens], mask[:rows, :tokens] = input_ids, attention_mask
    mask[rows:, 0] = 1
    return ids, mask


@dataclass
class Staged:
    """A batch on its device. `copied`: the event its copy recorded on the copy stream (CUDA, NPU);
    `host`: the pinned source tensors, kept alive until that copy has run."""

    rows: int
    ids: torch.Tensor
    mask: torch.Tensor
    copied: object | None = None  # torch.cuda.Event or torch.npu.Event
    host: tuple[torch.Tensor, ...] = ()


# Devices whose torch module has CUDA's stream API (torch_npu mirrors it as torch.npu).
STREAM_DEVICES = ("cuda", "npu")


def stream_module(device: torch.device) -> ModuleType | None:
    """torch.cuda or torch.npu for a device that copies on a stream of its own; None on a CPU."""
    return torch.get_device_module(device.type) if device.type in STREAM_DEVICES else None


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
        use_safetensors=True,
        trust_remote_code=spec.trust_remote_code,
        **_load_options(spec, attn),
    )
    return model.eval()


def _load_options(spec: ModelSpec, attn: str) -> dict:
    """What this encoder's class takes: no pooler where it has one, and `attn` where it implements
    it, else eager. Passed to every class alike, add_pooling_layer had failed DistilBERT, ELECTRA,
    DeBERTa-v2 and ModernBERT in a TypeError, and sdpa MPNet (all-mpnet-base-v2) in a ValueError."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    config = AutoConfig.from_pretrained(spec.path, trust_remote_code=spec.trust_remote_code)
    model_class = MODEL_MAPPING.get(type(config), None)
    if model_class is None:  # remote code: as a BERT, which those models mostly are
        return {"attn_implementation": attn, "add_pooling_layer": False}
    options = {"attn_implementation": attn if attn != "sdpa" or model_class._supports_sdpa else "eager"}
    if "add_pooling_layer" in inspect.signature(model_class.__init__).parameters:
        options["add_pooling_layer"] = False
    return options


def prepare_device(device: str) -> torch.device:
    if device.startswith("npu"):
        import torch_npu  # noqa: F401  (registers the "npu" device with torch)
    if device.startswith("cuda"):
        # cuDNN's attention builds a graph for every new shape: measured on an H100 (bench/launch.py),
        # the first batch at a shape took 51-78 ms more with it and 6-13 ms more without it, at the
        # same speed afterwards. Flash and memory-efficient attention remain.
        torch.backends.cuda.enable_cudnn_sdp(False)
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
        self.shape_step = 1 if self._device.type == "cpu" else SHAPE_STEP
        # On CUDA and Ascend a batch is copied from pinned memory on a stream of its own, so that
        # the copy of batch N+1 overlaps batch N's kernels (the engine process stages in another
        # thread). Measured on CUDA only (bench/SERVED.md); the NPU takes the same calls.
        self._streams = stream_module(self._device)
        self._copy_stream = self._streams.Stream(self._device) if self._streams is not None else None

    def embed(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.run(self.stage(input_ids, attention_mask))

    def stage(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> Staged:
        rows = len(input_ids)
        input_ids, attention_mask = bucketed(input_ids, attention_mask, self.shape_step)
        ids, mask = torch.from_numpy(input_ids), torch.from_numpy(attention_mask)
        if self._copy_stream is None:
            return Staged(rows, ids.to(self._device), mask.to(self._device))
        ids, mask = ids.pin_memory(), mask.pin_memory()
        with self._streams.stream(self._copy_stream):
            on_device = ids.to(self._device, non_blocking=True), mask.to(self._device, non_blocking=True)
            copied = self._streams.Event()
            copied.record(self._copy_stream)
        return Staged(rows, *on_device, copied=copied, host=(ids, mask))

    @torch.inference_mode()
    def run(self, staged: Staged) -> np.ndarray:
        if staged.copied is not None:
            compute = self._streams.current_stream(self._device)
            compute.wait_event(staged.copied)
            # Allocated on the copy stream, used on this one: the allocator must not reuse them
            # before this stream is done with them.
            staged.ids.record_stream(compute)
            staged.mask.record_stream(compute)
        hidden = self._model(input_ids=staged.ids, attention_mask=staged.mask).last_hidden_state
        return self._head(hidden, staged.mask)[: staged.rows].cpu().numpy()
