"""How far a backend's batched passes round from single-position passes over the same tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from specwire.models import LoadedModel


def rounding_gap(model: LoadedModel, tokens: list[int], positions: int = 5) -> float:
    """The largest logit difference over the last ``positions`` tokens: one position per pass (as AR
    computes them) against all of them in one pass after the same cache (as verification does)."""
    cache = make_prompt_cache(model.model)
    single = []
    for t in tokens:
        single.append(np.array(model.model(mx.array([[t]]), cache=cache)[0, -1].astype(mx.float32)))
    trim_prompt_cache(cache, positions)
    batched = np.array(model.model(mx.array([tokens[-positions:]]), cache=cache)[0].astype(mx.float32))
    return float(np.abs(np.stack(single[-positions:]) - batched).max())
