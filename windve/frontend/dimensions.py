"""The `dimensions` option: Matryoshka models' embeddings cut to their first d components."""

from __future__ import annotations

import numpy as np

from windve.frontend.errors import VALIDATION, ApiError
from windve.model import ModelSpec
from windve.settings import Settings


def allowed_dimensions(spec: ModelSpec, settings: Settings) -> tuple[int, ...]:
    """The sizes `dimensions` may ask for, ascending: the setting's, else the model's, and the full size.

    Sizes above the model's own are dropped: nothing can give them.
    """
    declared = settings.matryoshka_dims
    if declared is None:
        declared = spec.matryoshka_dims
    return tuple(sorted({d for d in declared if 0 < d < spec.dim} | {spec.dim}))


def requested_dimensions(requested: int | None, spec: ModelSpec, settings: Settings) -> int | None:
    """The size to cut to, or None for the full vectors; a 422 ApiError naming the allowed sizes."""
    if requested is None or requested == spec.dim:
        return None
    allowed = allowed_dimensions(spec, settings)
    if requested not in allowed:
        if len(allowed) == 1:
            why = f"{spec.name} gives {spec.dim}-dimensional embeddings and declares no Matryoshka dimensions"
        else:
            why = f"{spec.name} allows dimensions {', '.join(map(str, allowed))}"
        raise ApiError(422, f"dimensions={requested} is not supported: {why}", VALIDATION, param="dimensions")
    return requested


def cut(vectors: np.ndarray, dimensions: int | None, renormalize: bool) -> np.ndarray:
    """The first `dimensions` components of each vector, scaled back to unit length if `renormalize`."""
    if dimensions is None:
        return vectors
    head = vectors[:, :dimensions]
    if not renormalize:
        return np.ascontiguousarray(head)
    norms = np.linalg.norm(head, axis=1, keepdims=True)
    return head / np.maximum(norms, 1e-12)
