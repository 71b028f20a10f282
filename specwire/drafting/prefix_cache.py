"""A prompt cache across requests: a model's cache after a prefill, kept for prompts that start the same.

``PrefixCache`` keeps snapshots of an mlx-lm prompt cache, each after
prefilling a token sequence, least recently used first out, bounded by
entries and by bytes (as mlx_lm.server's ``--prompt-cache-size`` and
``--prompt-cache-bytes``). ``prefill`` fills a fresh cache from the entry
that shares the longest prefix with the new tokens, then runs only the
rest, and keeps a snapshot of the result.

How much of an entry a prompt can reuse depends on the cache's layers:

* KV caches (``KVCache``) hold one row per position: any shared prefix is
  reused, sliced to its length;
* any other layer (a recurrent ``ArraysCache`` of Qwen3.5, a rotating
  window) holds a state that cannot be cut back: the entry is reused only
  when the whole of it is a prefix of the new tokens, and ``why_not`` says
  so otherwise.

Entries live in scopes: a worker keeps each coordinator's entries under the
secret key that coordinator sends, so no coordinator's text is reused for,
or revealed to, another (the coordinator uses one scope).

A snapshot holds arrays of its own (contiguous copies of the KV rows, and
the recurrent arrays, which MLX never changes in place), so the live cache
writing on never alters it. All methods run on the compute thread.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from specwire.drafting.prompt_cache_flags import DEFAULT_BYTES, DEFAULT_ENTRIES
from specwire.drafting.rollback import layer_kind, load_state, save_state

SLICED = "sliced"  # a KV cache's rows, reusable up to any shared prefix
KEPT = ("arrays", "window")  # the rollback kinds whose whole state an entry keeps


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _arrays(state: Any) -> list[mx.array]:
    """Every array in a (nested) state."""
    if isinstance(state, (list, tuple)):
        return [a for x in state for a in _arrays(x)]
    return [state] if isinstance(state, mx.array) else []


def _copy(x: mx.array) -> mx.array:
    return mx.contiguous(x) if hasattr(mx, "contiguous") else mx.array(x)


@dataclass
class Entry:
    """The cache after prefilling ``tokens``: each layer's state and how to put it back, and their size."""

    tokens: tuple[int, ...]
    states: list[Any]
    kinds: list[str]  # SLICED, or the rollback kind whose state is kept (specwire.drafting.rollback)
    sliceable: bool  # every layer a KV cache: any prefix of the entry can be reused
    nbytes: int

    def usable(self, tokens: Sequence[int]) -> int:
        """Positions of this entry a prompt of ``tokens`` can reuse."""
        shared = shared_prefix(self.tokens, tokens)
        if self.sliceable:
            return shared
        return shared if shared == len(self.tokens) else 0


@dataclass
class Reuse:
    """What one lookup found: the positions reused, and why not more when a state could not be cut back."""

    cached: int = 0
    why_not: str = ""


@dataclass
class PrefixCache:
    """Snapshots of prefilled caches, least recently used evicted first (module docstring)."""

    max_entries: int = DEFAULT_ENTRIES
    max_bytes: int = DEFAULT_BYTES
    _entries: OrderedDict[tuple[str, tuple[int, ...]], Entry] = field(default_factory=OrderedDict)
    hits: int = 0
    misses: int = 0
    tokens_reused: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes the snapshots hold."""
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def restore(self, cache: list[Any], tokens: Sequence[int], scope: str = "") -> Reuse:
        """Fill the fresh ``cache`` from the entry of ``scope`` sharing most of ``tokens``."""
        best: tuple[int, tuple[str, tuple[int, ...]]] | None = None
        partial = 0
        for key, entry in self._entries.items():
            if key[0] != scope:
                continue
            n = entry.usable(tokens)
            partial = max(partial, shared_prefix(entry.tokens, tokens) if not entry.sliceable else 0)
            if n and (best is None or n > best[0]):
                best = (n, key)
        if best is None:
            self.misses += 1
            why = (
                f"{partial} tokens are shared with a cached prompt, but this model's recurrent or windowed "
                "layers keep a state only at a cached prompt's end, which this prompt does not reach"
                if partial
                else ""
            )
            return Reuse(0, why)
        n, key = best
        entry = self._entries[key]
        self._entries.move_to_end(key)
        for layer, state, kind in zip(cache, entry.states, entry.kinds, strict=True):
            if kind == SLICED:
                keys, values = state
                layer.state = (keys[..., :n, :], values[..., :n, :], n)
            else:
                load_state(layer, kind, 0, state)
        self.hits += 1
        self.tokens_reused += n
        return Reuse(n)

    def store(self, tokens: Sequence[int], cache: list[Any], scope: str = "") -> None:
        """Keep a snapshot of ``cache``, which holds ``tokens`` (a KV layer may hold rows after them, which
        are left out; any other layer's state must be the one after exactly ``tokens``); evict to stay
        within the bounds."""
        if not tokens:
            return
        states: list[Any] = []
        kinds: list[str] = []
        for layer in cache:
            if type(layer) is KVCache:
                keys, values, n = layer.state
                if keys is None or values is None or n < len(tokens):
                    return  # nothing was prefilled, or less than ``tokens``
                rows = len(tokens)
                states.append((_copy(keys[..., :rows, :]), _copy(values[..., :rows, :])))
                kinds.append(SLICED)
            else:
                kind = layer_kind(layer)
                if kind not in KEPT:
                    return  # a layer whose state this cache cannot keep (another trimmable kind)
                states.append(save_state(layer, kind))
                kinds.append(kind)
        arrays = _arrays(states)
        mx.eval(arrays)
        nbytes = sum(a.nbytes for a in arrays)
        if nbytes > self.max_bytes or self.max_entries < 1:
            return
        sliceable = all(kind == SLICED for kind in kinds)
        key = (scope, tuple(tokens))
        if sliceable:  # an entry this one extends is of no more use
            extended = [
                k for k, e in self._entries.items() if k[0] == scope and e.usable(tokens) == len(k[1])
            ]
            for old in extended:
                del self._entries[old]
        self._entries[key] = Entry(tuple(tokens), states, kinds, sliceable, nbytes)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
            self._entries.popitem(last=False)

    def stats(self) -> dict[str, int]:
        """Entries, bytes, hits, misses and tokens reused, for /health and /v1/status."""
        return {
            "entries": len(self._entries),
            "bytes": self.nbytes,
            "max_entries": self.max_entries,
            "max_bytes": self.max_bytes,
            "hits": self.hits,
            "misses": self.misses,
            "tokens_reused": self.tokens_reused,
        }


@dataclass
class PromptCaches:
    """A process's prompt caches: one per model it prefills (the target, each local draft), each within
    the same bounds, and the secret key that scopes its entries on the workers (``Open.cache_key``)."""

    max_entries: int = DEFAULT_ENTRIES
    max_bytes: int = DEFAULT_BYTES
    key: str = field(default_factory=lambda: secrets.token_hex(16))
    caches: dict[str, PrefixCache] = field(default_factory=dict)

    def of(self, model: str) -> PrefixCache:
        """The prompt cache of the model ``model`` names (made on first use)."""
        if model not in self.caches:
            self.caches[model] = PrefixCache(self.max_entries, self.max_bytes)
        return self.caches[model]

    def stats(self) -> dict[str, dict[str, int]]:
        """Each model's cache: entries, bytes, hits, misses, tokens reused."""
        return {model: cache.stats() for model, cache in self.caches.items()}
