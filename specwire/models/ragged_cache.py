"""One KV cache for a batch of sequences of different lengths, each rolled back on its own.

mlx-lm's ``BatchKVCache`` trims every row alike; speculative decoding needs
each row to keep its own accepted count. Here each row's positions live in
storage *slots*, and ``RaggedLayout.slots[b]`` maps row b's positions to
them. A pass writes ``n`` slots at the common write index for every row (a
row with fewer tokens pads; its pad slots never become positions), and
``commit(counts)`` then makes the first ``counts[b]`` of row b's new slots
its next positions. ``truncate(b, length)`` drops a row's positions past
``length`` (its rejected drafts): their slots become holes that no query
attends to. A new token's rotary position is its row's length, whatever its
slot (``offset`` is per row), so a hole changes nothing a query computes.
``compact()`` moves every row's positions together, left-padded to the
longest, once that would halve the storage.

Every layer of the model shares one ``RaggedLayout``; each attention
layer's ``RaggedKV`` holds its keys and values. A recurrent layer (Qwen3.5's
Gated DeltaNet) keeps one state a row (``RowStates``, mlx-lm's
``ArraysCache`` with a row per sequence): a pass whose rows feed different
numbers of tokens sets its ``lengths``, so each row's state stops at its own
last token (mlx-lm's pass masks the padding), and rolling a row back puts a
kept state back into its row (``set_rows``). Models batch this way when every
layer is a plain ``KVCache``, or a ``KVCache`` or a dense Qwen3.5 Gated
DeltaNet layer (``batchable``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache

STEP = 256  # slots a layer's storage grows by
COMPACT_SHARE = 0.5  # of the storage that compacting must free before ``tidy`` moves the rows together
COMPACT_MIN_SLOTS = 64


LayerRow = tuple[mx.array | None, mx.array | None]  # a row's keys and values, or its two recurrent states


def batchable(model: Any) -> bool:
    """Whether ``model``'s every layer is a plain KV cache or a dense Qwen3.5 Gated DeltaNet layer (none
    windowed or quantized, no other recurrent kind: their passes would not stop each row at its length)."""
    cache = make_prompt_cache(model)
    if all(type(layer) is KVCache for layer in cache):
        return True
    text = getattr(getattr(model, "language_model", None), "model", None)
    layers = getattr(text, "layers", None)
    if layers is None or len(layers) != len(cache):
        return False
    return all(
        type(c) is KVCache
        or (type(c) is ArraysCache and hasattr(getattr(layer, "linear_attn", None), "in_proj_qkv"))
        for layer, c in zip(layers, cache, strict=True)
    )


class RaggedLayout:
    """Where each row's positions are in the storage every layer shares (module docstring)."""

    def __init__(self) -> None:
        self.slots: list[np.ndarray] = []  # row -> its positions' slots, in order
        self.size = 0  # slots written so far: the next pass writes from here
        self.layers: list[RaggedKV | RowStates] = []  # every layer of the model, in order
        self._mask: mx.array | None = None
        self._offsets: mx.array | None = None

    @property
    def rows(self) -> int:
        return len(self.slots)

    def lengths(self) -> list[int]:
        """Each row's positions."""
        return [len(s) for s in self.slots]

    def begin(self, n: int) -> None:
        """Prepare a pass of ``n`` new slots a row: its mask (each row's positions, then causal among the
        new slots) and each row's rotary offset."""
        valid = np.zeros((self.rows, self.size), dtype=bool)
        for b, slots in enumerate(self.slots):
            valid[b, slots] = True
        causal = np.tril(np.ones((n, n), dtype=bool))
        mask = np.concatenate(
            [
                np.broadcast_to(valid[:, None, :], (self.rows, n, self.size)),
                np.broadcast_to(causal, (self.rows, n, n)),
            ],
            axis=2,
        )
        self._mask = mx.array(mask[:, None])
        self._offsets = mx.array(self.lengths(), dtype=mx.int32)

    def commit(self, n: int, counts: Sequence[int]) -> None:
        """After a pass of ``n`` slots a row: row b's first ``counts[b]`` new slots become its positions."""
        for b, count in enumerate(counts):
            if not 0 <= count <= n:
                raise ValueError(f"row {b} keeps {count} of a pass's {n} slots")
            self.slots[b] = np.concatenate([self.slots[b], self.size + np.arange(count)])
        self.size += n
        self._mask = self._offsets = None

    def truncate(self, row: int, length: int) -> None:
        """Keep row ``row``'s first ``length`` positions."""
        self.slots[row] = self.slots[row][:length]

    def holes(self) -> int:
        """Storage slots that hold no row's position."""
        return self.rows * self.size - sum(self.lengths())

    def tidy(self) -> None:
        """``compact`` once that would shrink the storage by more than ``COMPACT_SHARE`` (a long row's
        left padding of the short ones is no waste that compacting removes)."""
        longest = max(self.lengths(), default=0)
        if self.size >= COMPACT_MIN_SLOTS and longest < (1 - COMPACT_SHARE) * self.size:
            self.compact()

    def compact(self) -> None:
        """Move every row's positions together, right-aligned to the longest row (left padding)."""
        self.rebuild([self.row(b) for b in range(self.rows)])

    @property
    def attention(self) -> list[RaggedKV]:
        return [layer for layer in self.layers if isinstance(layer, RaggedKV)]

    @property
    def recurrent(self) -> list[RowStates]:
        return [layer for layer in self.layers if isinstance(layer, RowStates)]

    def row(self, b: int) -> list[LayerRow] | None:
        """Row ``b``'s layers: keys and values, its positions in order ([1, heads, length, dim]), or a
        recurrent layer's two states ([1, ...]); None while no row holds a position."""
        if any(layer.keys is None for layer in self.attention):
            return None
        index = mx.array(self.slots[b].astype(np.int32))
        out: list[LayerRow] = []
        for layer in self.layers:
            if isinstance(layer, RaggedKV):
                keys, values = layer.stored
                out.append(
                    (mx.take(keys[b : b + 1], index, axis=2), mx.take(values[b : b + 1], index, axis=2))
                )
            else:
                out.append(layer.row(b))
        return out

    def remove(self, row: int) -> None:
        """Drop row ``row``."""
        keep = [b for b in range(self.rows) if b != row]
        if not keep:
            self.slots, self.size = [], 0
            for layer in self.layers:
                layer.clear()
            return
        index = mx.array(keep)
        for layer in self.layers:
            layer.take(index)
        del self.slots[row]
        self.tidy()

    def add(self, layers: Sequence[LayerRow] | None) -> None:
        """A new last row holding ``layers`` (as ``row`` gives them: keys and values [1, heads, length,
        dim], or a recurrent layer's states; None for a row with no position yet)."""
        self.extend(self.holding([layers]))

    def holding(self, rows: Sequence[Sequence[LayerRow] | None]) -> RaggedLayout:
        """A new layout, its layers of the same kinds as these, whose row b holds ``rows[b]`` (as ``add``
        takes them)."""
        layout = RaggedLayout()
        for layer in self.layers:
            type(layer)(layout)
        layout.rebuild(rows)
        return layout

    def extend(self, other: RaggedLayout) -> None:
        """Append ``other``'s rows (a layout of the same model), the two storages right-aligned to the
        longer: a concatenation a layer, as mlx-lm's ``BatchKVCache.extend``, rather than every row
        gathered and padded anew (``rebuild``). Holes stay, for ``tidy``."""
        size = max(self.size, other.size)
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            mine.append_rows(theirs, size)  # type: ignore[arg-type]  # layers of one kind, layer by layer
        mx.eval(*[a for layer in self.layers for a in layer.arrays()])
        shift, other_shift = size - self.size, size - other.size
        self.slots = [s + shift for s in self.slots] + [s + other_shift for s in other.slots]
        self.size = size
        self._mask = self._offsets = None

    def rebuild(self, rows: Sequence[Sequence[LayerRow] | None]) -> None:
        """The storage made anew from each row's layers (None: no positions yet), the keys and values
        left-padded to the longest row."""
        first = next((i for i, layer in enumerate(self.layers) if isinstance(layer, RaggedKV)), None)
        lengths = [_length(pairs[first]) if pairs and first is not None else 0 for pairs in rows]
        size = max(lengths)
        for i, layer in enumerate(self.layers):
            layer.rebuild([pairs[i] if pairs else None for pairs in rows], size)
        mx.eval(*[a for layer in self.layers for a in layer.arrays()])
        self.slots = [np.arange(size - n, size) for n in lengths]
        self.size = size
        self._mask = self._offsets = None


def _padded(a: mx.array, size: int, capacity: int) -> mx.array:
    """``a`` ([1, heads, n, dim]) placed to end at slot ``size`` of ``capacity`` slots, zeros elsewhere."""
    _, heads, n, dim = a.shape
    out = mx.zeros((1, heads, capacity, dim), dtype=a.dtype)
    out[:, :, size - n : size, :] = a
    return out


def _length(pair: LayerRow) -> int:
    keys = pair[0]
    return 0 if keys is None else int(keys.shape[2])


def row_of(states: LayerRow, b: int) -> LayerRow:
    """Row ``b`` of a batch's (convolution, recurrent) states, each [rows, ...] or None."""
    conv, state = states
    return (None if conv is None else conv[b : b + 1], None if state is None else state[b : b + 1])


def _rows_of(parts: Sequence[mx.array | None]) -> mx.array | None:
    """Rows ([1, ...] each) stacked into a batch; a missing row is zeros (a state not yet begun)."""
    shaped = next((p for p in parts if p is not None), None)
    if shaped is None:
        return None
    return mx.concatenate([p if p is not None else mx.zeros_like(shaped) for p in parts])


class RowStates(ArraysCache):
    """A recurrent layer's states, a row per sequence of a ``RaggedLayout`` (mlx-lm's ``ArraysCache``)."""

    def __init__(self, layout: RaggedLayout) -> None:
        super().__init__(2)
        self.cache: list[Any] = [None, None]  # the convolution state, then the recurrent state: [rows, ...]
        self.lengths: mx.array | None = None  # type: ignore[assignment]  # each row's tokens in a ragged pass
        self.layout = layout
        layout.layers.append(self)

    def row(self, b: int) -> LayerRow:
        """Row ``b``'s convolution and recurrent states ([1, ...]; None before any pass)."""
        return row_of((self.cache[0], self.cache[1]), b)

    def set_rows(self, rows: Sequence[LayerRow]) -> None:
        """Every row's states at once (``rows`` as ``row`` gives them)."""
        self.cache = [_rows_of([r[0] for r in rows]), _rows_of([r[1] for r in rows])]

    def rebuild(self, rows: Sequence[LayerRow | None], size: int) -> None:
        self.set_rows([r if r is not None else (None, None) for r in rows])

    def append_rows(self, other: RowStates, size: int) -> None:
        mine = [self.row(b) for b in range(self.layout.rows)]
        self.set_rows([*mine, *(other.row(b) for b in range(other.layout.rows))])

    def take(self, index: mx.array) -> None:
        self.cache = [None if a is None else a[index] for a in self.cache]

    def clear(self) -> None:
        self.cache = [None, None]

    def arrays(self) -> list[mx.array]:
        return [a for a in self.cache if a is not None]


class RaggedKV:
    """One layer's keys and values for every row of a ``RaggedLayout`` (mlx-lm's cache interface)."""

    def __init__(self, layout: RaggedLayout) -> None:
        self.layout = layout
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        layout.layers.append(self)

    @property
    def offset(self) -> mx.array:
        """Each row's rotary position for the pass's first new token: its length."""
        offsets = self.layout._offsets
        assert offsets is not None, "begin() the pass first"
        return offsets

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        mask = self.layout._mask
        assert mask is not None and mask.shape[2] == n, "begin() the pass with its number of slots"
        return mask

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        start, n = self.layout.size, keys.shape[2]
        if self.keys is None or start + n > self.keys.shape[2]:
            self._grow(start + n, keys, values)
        assert self.keys is not None and self.values is not None
        self.keys[:, :, start : start + n, :] = keys
        self.values[:, :, start : start + n, :] = values
        return self.keys[:, :, : start + n, :], self.values[:, :, : start + n, :]

    def _grow(self, needed: int, keys: mx.array, values: mx.array) -> None:
        b, heads, _, k_dim = keys.shape
        v_dim = values.shape[3]
        capacity = (needed + STEP - 1) // STEP * STEP
        new_k = mx.zeros((b, heads, capacity, k_dim), keys.dtype)
        new_v = mx.zeros((b, heads, capacity, v_dim), values.dtype)
        if self.keys is not None and self.values is not None:
            kept = self.layout.size
            new_k[:, :, :kept, :] = self.keys[:, :, :kept, :]
            new_v[:, :, :kept, :] = self.values[:, :, :kept, :]
        self.keys, self.values = new_k, new_v

    def rebuild(self, rows: Sequence[LayerRow | None], size: int) -> None:
        """Every row's keys and values (None: none yet), right-aligned to end at slot ``size``."""
        shaped = next((r for r in rows if r is not None and r[0] is not None), None)
        if shaped is None:  # no row holds a position yet: the first pass sizes the storage
            self.clear()
            return
        assert shaped[0] is not None and shaped[1] is not None
        empty = shaped[0][:, :, :0], shaped[1][:, :, :0]
        capacity = size + STEP
        keys, values = [], []
        for r in rows:
            k, v = r if r is not None and r[0] is not None else empty
            assert k is not None and v is not None
            keys.append(_padded(k, size, capacity))
            values.append(_padded(v, size, capacity))
        self.keys, self.values = mx.concatenate(keys), mx.concatenate(values)

    def append_rows(self, other: RaggedKV, size: int) -> None:
        """Append ``other``'s rows; both storages' positions moved to end at slot ``size``."""
        mine, theirs = self._aligned(size), other._aligned(size)
        shaped = mine or theirs
        if shaped is None:  # no row of either holds a position yet
            return
        rows = (self.layout.rows, other.layout.rows)
        keys, values = [], []
        for part, n in zip((mine, theirs), rows, strict=True):
            if n == 0:
                continue
            k, v = part or tuple(mx.zeros((n, *a.shape[1:]), a.dtype) for a in shaped)
            keys.append(k)
            values.append(v)
        self.keys, self.values = mx.concatenate(keys), mx.concatenate(values)

    def _aligned(self, size: int) -> tuple[mx.array, mx.array] | None:
        """The stored positions moved to end at slot ``size``, with room to grow (None: none stored)."""
        if self.keys is None or self.values is None:
            return None
        n = self.layout.size
        pad = [(0, 0), (0, 0), (size - n, STEP), (0, 0)]
        return mx.pad(self.keys[:, :, :n], pad), mx.pad(self.values[:, :, :n], pad)

    def take(self, index: mx.array) -> None:
        if self.keys is not None and self.values is not None:
            self.keys, self.values = self.keys[index], self.values[index]

    def clear(self) -> None:
        self.keys = self.values = None

    @property
    def stored(self) -> tuple[mx.array, mx.array]:
        """The keys and values stored (every slot); a layer that has stored none is an error."""
        assert self.keys is not None and self.values is not None, "no pass has stored keys yet"
        return self.keys, self.values

    @property
    def state(self) -> list[mx.array]:
        return self.arrays()

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.keys, self.values) if a is not None]


def ragged_cache(model: Any) -> tuple[RaggedLayout, list[RaggedKV | RowStates]]:
    """A layout and a layer cache per layer of ``model`` (``batchable`` models)."""
    layout = RaggedLayout()
    layers = [
        RowStates(layout) if isinstance(c, ArraysCache) else RaggedKV(layout)
        for c in make_prompt_cache(model)
    ]
    return layout, layers


def kv_rows(cache: Sequence[Any]) -> list[LayerRow] | None:
    """A single sequence's mlx-lm caches as ``RaggedLayout.add`` takes them: (keys, values) of its positions
    for a KV cache, the two states of a recurrent one; None while it holds no position."""
    if any(isinstance(layer, KVCache) and layer.keys is None for layer in cache):
        return None
    out: list[LayerRow] = []
    for layer in cache:
        if isinstance(layer, KVCache):
            keys, values = layer.keys, layer.values
            assert keys is not None and values is not None
            out.append((keys[:, :, : layer.offset, :], values[:, :, : layer.offset, :]))
        else:
            out.append((layer[0], layer[1]))
    return out
