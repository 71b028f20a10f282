"""Prompts prefilled together: the requests ``serve`` admits at once, in the same passes.

mlx-lm's ``BatchGenerator`` prefills the prompts it admits together, padded
to the longest, where ``serve``'s batch once prefilled each alone and joined
each in turn (every join rebuilding every row's storage). Here the prompts
admitted together become the rows of one new ragged cache
(``specwire.models.ragged_cache``), which the batch then takes in one
concatenation a layer (``RaggedLayout.extend``):

- each row starts from the prompt cache's longest usable entry, and only its
  suffix is fed; a pass feeds every row's next chunk, a shorter row padded at
  its end, where its own queries cannot see the padding (causal), its pad
  slots never become positions, and its rotary positions are its own;
- each row's prompt is then kept in the prompt cache, as a prefill alone
  keeps it;
- prompts of very different lengths go in different groups
  (``length_groups``), so that a long one does not pad many short ones to
  its length; on a CPU only prompts of one length share a pass
  (``pad_share``).

Only models whose every layer is a KV cache are prefilled this way
(``DecodingBatch.admit`` says why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from specwire.drafting.drafter import PREFILL_STEP
from specwire.drafting.prefix_cache import PrefixCache, Reuse
from specwire.models.ragged_cache import LayerRow, RaggedLayout, kv_rows, ragged_cache

PAD_SHARE = 2.0  # on a GPU, a group's positions, padding included, at most this many times its prompts' own


def pad_share() -> float:
    """How much padding a group may carry: ``PAD_SHARE`` on a GPU, where a pass of a few hundred positions
    costs about what one of a few does (``docs/serving.md``, the batch curve), so a pass saved pays for
    its padding; none on a CPU, where a pass's time grows with its positions (the default model on this
    project's 2-core VM: 1.75 s for 13 positions, about 0.12 s more a position), so padded positions
    cost what the passes saved would (admitting 8 prompts of 12-19 tokens padded together took 19.2 s
    there against 16.0 s one at a time: ``scripts/measure/admission.py``)."""
    return PAD_SHARE if mx.default_device() == mx.gpu else 1.0


def length_groups(lengths: Sequence[int], share: float | None = None) -> list[list[int]]:
    """Indices of ``lengths`` in groups prefilled together: longest first, a group taking the next
    while its padded positions stay within ``share`` (``pad_share()``) times its own."""
    share = pad_share() if share is None else share
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        group = groups[-1] if groups else None
        if group is not None:
            own = sum(lengths[j] for j in group) + lengths[i]
            if (len(group) + 1) * lengths[group[0]] <= share * own:
                group.append(i)
                continue
        groups.append([i])
    return groups


def prefill_together(
    model: Any,
    contexts: Sequence[Sequence[int] | None],
    prefix_cache: PrefixCache | None,
    step: int = PREFILL_STEP,
) -> tuple[RaggedLayout, list[Reuse]]:
    """A layout whose row b holds ``contexts[b]`` (None: a row with no position), every row prefilled in
    the same passes of up to ``step`` positions a row, each from ``prefix_cache`` where it can; returns
    it and what each row reused."""
    layout, cache = ragged_cache(model)
    reuses: list[Reuse] = []
    restored: list[list[LayerRow] | None] = []
    for tokens in contexts:
        own = make_prompt_cache(model)
        reuse = prefix_cache.restore(own, tokens) if tokens and prefix_cache is not None else Reuse()
        reuses.append(reuse)
        restored.append(kv_rows(own) if reuse.cached else None)
    layout.rebuild(restored)
    suffixes = [list(tokens or [])[reuse.cached :] for tokens, reuse in zip(contexts, reuses, strict=True)]
    for first in range(0, max(map(len, suffixes), default=0), step):
        chunks = [suffix[first : first + step] for suffix in suffixes]
        width = max(map(len, chunks))
        layout.begin(width)
        model(mx.array([chunk + [0] * (width - len(chunk)) for chunk in chunks]), cache=cache)
        layout.commit(width, [len(chunk) for chunk in chunks])
        mx.eval(*[a for layer in layout.layers for a in layer.arrays()])
    if prefix_cache is not None:
        for b, (tokens, reuse) in enumerate(zip(contexts, reuses, strict=True)):
            if tokens and len(tokens) > reuse.cached:
                prefix_cache.store(tokens, own_cache(model, layout.row(b)))
    return layout, reuses


def own_cache(model: Any, layers: Sequence[LayerRow] | None) -> list[Any]:
    """mlx-lm's cache for one sequence, holding a row's ``layers`` (as ``RaggedLayout.row`` gives them)."""
    cache = make_prompt_cache(model)
    for layer, (a, b) in zip(cache, layers or [], strict=False):
        if isinstance(layer, KVCache):
            assert a is not None
            layer.keys, layer.values, layer.offset = a, b, a.shape[2]
        else:  # a recurrent layer's convolution and recurrent states
            layer[0], layer[1] = a, b
    return cache
