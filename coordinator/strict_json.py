"""Values made strict JSON: NaN and infinities (a figure with nothing to measure) become null."""

from __future__ import annotations

import math
from typing import Any


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float, in dicts, lists and tuples too, replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value
