"""Model engines: one small interface (embed a tokenized batch -> float32 array), one file each."""

from windve.engines.base import Engine, pad_batch
from windve.engines.factory import create_engine, resolve_dtype

__all__ = ["Engine", "create_engine", "pad_batch", "resolve_dtype"]
