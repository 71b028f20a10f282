"""Rolling a prompt cache back, whether or not every layer can be trimmed.

mlx-lm's caches are of two kinds. A KV cache (attention) is trimmable:
dropping its last n positions restores it exactly. A recurrent layer's cache
(``ArraysCache``: the convolution and delta-rule state of a Gated DeltaNet
layer, a Mamba layer's state, ...) is not: it holds one state, already past
every position fed. Hybrid models (Qwen3.5, Qwen3-Next, LFM2, Granite
hybrids) mix both.

``Checkpoints`` keeps, for the recurrent layers, their state at chosen
positions (after each forward pass, for a drafter). MLX arrays are
immutable and every update of an ``ArraysCache`` puts a new array in its
slots, so keeping a state costs a list of references, not a copy. Rolling
back to a kept position puts those states back and trims the trimmable
layers by the same count; the state is then exactly what a plain pass over
the kept prefix gives. A position between kept ones is reached from the
nearest earlier one, feeding the tokens after it again (``nearest``).

A rotating window (``RotatingKVCache``: Gemma 3's sliding-window layers)
can be trimmed only until it first fills, so it is kept as a state too, as
copies (it writes its arrays in place). Any other cache layer that is
neither trimmable nor an ``ArraysCache`` cannot be rolled back:
``Checkpoints`` refuses it by name. A layer may also roll itself back to a kept position (a
``restore(position)`` method): the per-op baseline's shadow of a worker's
cache does, by asking the worker to restore the state it kept there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, RotatingKVCache

from specwire.errors import UnsupportedModelError


def layer_kind(layer: Any) -> str:
    """How a cache layer rolls back: "self", "window", "trim" or "arrays" (refused otherwise)."""
    if hasattr(layer, "restore"):
        return "self"
    if isinstance(layer, RotatingKVCache):  # trimmable only until its window first fills: kept as a state
        return "window"
    if layer.is_trimmable():
        return "trim"
    if isinstance(layer, ArraysCache):
        return "arrays"
    raise UnsupportedModelError(
        f"a {type(layer).__name__} cache can be neither trimmed nor restored, so drafts cannot be "
        "rolled back; specwire rolls back KV caches and recurrent (ArraysCache) state"
    )


class Checkpoints:
    """Kept states of one prompt cache's recurrent layers, by position (module docstring)."""

    def __init__(self, cache: Sequence[Any]) -> None:
        self.cache = cache
        self.kinds = [layer_kind(layer) for layer in cache]
        self.exact = all(kind == "trim" for kind in self.kinds)  # any position, with no state kept
        self.kept: dict[int, list[Any]] = {}

    def keep(self, position: int) -> None:
        """Remember the state after the first ``position`` tokens (the cache holds exactly those)."""
        if self.exact:
            return
        self.kept[position] = [
            save_state(layer, kind) for layer, kind in zip(self.cache, self.kinds, strict=True)
        ]

    def nearest(self, position: int) -> int:
        """The furthest position at or before ``position`` that the cache can be rolled back to."""
        if self.exact:
            return position
        return max((p for p in self.kept if p <= position), default=0)

    def rewind(self, current: int, to: int) -> None:
        """Roll the cache back from ``current`` tokens to ``to`` (a kept position, or any if exact)."""
        if to >= current:
            return
        if self.exact:
            for layer in self.cache:
                layer.trim(current - to)
            return
        saved = self.kept.get(to)
        if saved is None and to > 0:
            raise RuntimeError(f"no state kept at position {to} (kept: {sorted(self.kept)})")
        for layer, kind, state in zip(self.cache, self.kinds, saved or [None] * len(self.cache), strict=True):
            if kind == "self":
                layer.restore(to)
            else:
                load_state(layer, kind, current - to, state)
        self.forget_after(to)

    def forget_after(self, position: int) -> None:
        """Drop kept states past ``position`` (they describe tokens no longer in the cache)."""
        self.kept = {p: s for p, s in self.kept.items() if p <= position}

    def forget_before(self, position: int) -> None:
        """Drop kept states before ``position``: nothing will roll back past it again."""
        self.kept = {p: s for p, s in self.kept.items() if p >= position}


def save_state(layer: Any, kind: str) -> Any:
    """What ``load_state`` needs to put a layer of ``kind`` back as it is now (None for "trim")."""
    if kind == "arrays":
        return (list(layer.cache), layer.lengths, layer.left_padding)
    if kind == "window":  # its arrays are written in place as it rotates: kept as copies
        return _window_copy(layer.state)
    return None


def _window_copy(state: tuple) -> tuple:
    keys, values, *rest = state
    return (None if keys is None else mx.array(keys), None if values is None else mx.array(values), *rest)


def load_state(layer: Any, kind: str, drop: int, state: Any) -> None:
    """Put a layer back: trim ``drop`` positions, or restore ``state`` (None: the empty cache)."""
    if kind == "trim":
        layer.trim(drop)
    elif kind == "window":
        if state is None:  # back to the empty cache
            layer.keys = layer.values = None
            layer.offset = layer._idx = 0
        else:
            layer.state = _window_copy(state)
    elif kind == "arrays":
        if state is None:  # back to the empty cache
            layer.cache = [None] * len(layer.cache)
            layer.lengths = layer.left_padding = None
        else:
            cache, layer.lengths, layer.left_padding = state
            layer.cache = list(cache)
