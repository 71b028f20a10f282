"""Several generations decoded together: each round drafts for all of them and verifies all in one pass.

``serve`` runs concurrent requests this way (``coordinator.serving.scheduler``).
Each round:

1. the local draft model drafts a chain for every row at once: a pass over
   the rows' unfed tokens (one or two: the last verdict's), then a pass a
   draft, every row in the same pass;
2. the target verifies every row's ``[pending, d_1 .. d_k]`` in one pass
   over all rows;
3. each row accepts by its own sampling parameters and generator, exactly as
   alone (``coordinator.decoding.acceptance``), and its ``Decoding`` emits
   and records the round;
4. each row keeps its own accepted positions in both caches
   (``specwire.models.ragged_cache``: rows roll back on their own).

On Apple Silicon a pass's time is flat in its positions up to a few dozen
(the profile's curve: ``specwire.emulation.profile``), so B rows' round costs
about one row's, and the batch decodes about B times as fast. Rows may ask
for different k; the drafts run to the largest and a row verifies only its
own. At T = 0 each row's output is its output alone; at T > 0 each row's
tokens follow the target's distribution, drawn with its own generators as a
``Drafter`` and the engine draw them (block i's drafts from generator i), so
with the same k and a backend that computes a row alike in a batch (MLX's
CPU backend does, bit for bit) a row's output equals its ``--draft local``
run alone at any temperature.

Models batch whose every layer is a KV cache, or a KV cache or a dense
Qwen3.5 Gated DeltaNet layer (``batchable``). The target verifies such a
model's rows keeping every position's recurrent state
(``coordinator.decoding.recurrent_pass``), and each row takes back the
state after its own accepted tokens; the draft keeps each row's state after
every pass of the round and takes back the one its verdict leaves. A
generation joins with its target cache as it stands (its own draft source
closed) and its draft context prefilled from the draft's prompt cache; the
last row left may be handed back to run alone (``release``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache

from coordinator.decoding.acceptance import accept_greedy, accept_sampled
from coordinator.decoding.batch_prefill import length_groups, own_cache, prefill_together
from coordinator.decoding.engine import Decoding
from coordinator.decoding.recurrent_pass import forward_keeping_states, keeps_states
from specwire.drafting.drafter import DRAFT_STREAM, DraftBlock, prefill_cached
from specwire.drafting.prefix_cache import PrefixCache
from specwire.drafting.sampling import SparseDistribution, choose_draft_token
from specwire.emulation.pace import hold_pass
from specwire.errors import InvalidArgumentError, UnsupportedModelError
from specwire.logits.processors import Choices, ProcessedRows, chain_suffix
from specwire.models.loading import LoadedModel
from specwire.models.ragged_cache import (
    LayerRow,
    RowStates,
    batchable,
    kv_rows,
    ragged_cache,
    row_of,
)

CATCH_UP = 8  # tokens a row's draft context may lag before it is prefilled on its own


@dataclass(eq=False)
class Row:
    """One generation in the batch: its k, its tokens so far (the last is pending), its blocks drafted."""

    decoding: Decoding
    k: int
    tokens: list[int]
    blocks: int = 0  # rounds drafted for it: block i's drafts are drawn from generator i, as a Drafter's
    drafts: list[int] = field(default_factory=list)
    dists: list[SparseDistribution] = field(default_factory=list)


class DecodingBatch:
    """The generations decoded together on one target and one local draft model (module docstring)."""

    def __init__(
        self, target: LoadedModel, draft: LoadedModel | None, draft_prompts: PrefixCache | None = None
    ) -> None:
        self.target = target
        self.draft = draft  # None: every row decodes with the target alone (k = 0)
        self.draft_prompts = draft_prompts
        refused = batch_refusal(target, draft)
        if refused:
            raise UnsupportedModelError(refused)
        self.target_layout, self.target_cache = ragged_cache(target.model)
        self.draft_layout, self.draft_cache = ragged_cache((draft or target).model)
        self.rows: list[Row] = []
        self._draft_states: list[list[LayerRow]] = []  # each recurrent draft layer's states after each pass
        self.rounds = 0
        self.widest = 0  # most rows a round has verified together

    def join(self, decoding: Decoding, k: int) -> None:
        """Add ``decoding`` (begun; its own draft source is closed here), ``k`` drafts a round. Compute
        thread."""
        tokens = decoding.context()
        cache = decoding.rollback.cache
        if any(isinstance(layer, KVCache) and layer.offset != len(tokens) - 1 for layer in cache):
            raise InvalidArgumentError("a generation joins the batch with its target cache at its context")
        if k and self.draft is None:
            raise InvalidArgumentError("a batch without a draft model decodes with the target alone (k = 0)")
        decoding.detach_source()
        self.target_layout.add(kv_rows(cache))
        try:  # a row that drafts nothing has no draft context until it does (_catch_up)
            self.draft_layout.add(self._draft_context(tokens) if k else None)
        except BaseException:
            self.target_layout.remove(self.target_layout.rows - 1)
            raise
        del cache[:]  # its rows live in the batch now (emptied in place: its rollback's checkpoints share it)
        drafted = sum(1 for record in decoding.result.rounds if record.k)  # blocks its own drafter drew
        self.rows.append(Row(decoding, k, tokens, drafted))

    def admit(self, decodings: Sequence[Decoding], ks: Sequence[int]) -> None:
        """Add generations begun without their prefill (``begin(..., prefill=False)``), ``ks[i]`` drafts
        a round each: their prompts prefilled together, a group of like lengths at a time, and each group
        joined at once (``coordinator.decoding.batch_prefill``). Compute thread."""
        if any(ks) and self.draft is None:
            raise InvalidArgumentError("a batch without a draft model decodes with the target alone (k = 0)")
        if self.target_layout.recurrent or self.draft_layout.recurrent:
            # A padded pass stops each row's recurrent state at its own length only over a few tokens
            # (the draft's first pass of a round); a prompt's state is what its solo, chunked prefill
            # leaves, which a long padded pass would not reproduce. So each is prefilled alone and joined.
            for decoding, k in zip(decodings, ks, strict=True):
                decoding.prefill()
                self.join(decoding, k)
            return
        before = len(self.rows)
        try:
            self._admit_together(decodings, ks)
        except BaseException:  # the batch as it was: none of them joined
            for layout in (self.target_layout, self.draft_layout):
                while layout.rows > before:
                    layout.remove(layout.rows - 1)
            del self.rows[before:]
            raise

    def _admit_together(self, decodings: Sequence[Decoding], ks: Sequence[int]) -> None:
        contexts = [decoding.context()[:-1] for decoding in decodings]
        for group in length_groups([len(c) for c in contexts]):
            prompts = decodings[group[0]].decoder.prefix_cache  # the target's prompt cache (serve's one)
            target, reuses = prefill_together(self.target.model, [contexts[i] for i in group], prompts)
            drafting = [contexts[i] if ks[i] else None for i in group]  # a row that drafts nothing
            # has no draft context until it does (_catch_up)
            draft = (
                prefill_together(self.draft.model, drafting, self.draft_prompts)[0]
                if self.draft is not None and any(drafting)
                else self.draft_layout.holding([None] * len(group))  # no position yet
            )
            self.target_layout.extend(target)
            self.draft_layout.extend(draft)
            for i, reuse in zip(group, reuses, strict=True):
                decoding = decodings[i]
                decoding.detach_source()
                decoding.prefilled_by(reuse)
                del decoding.rollback.cache[:]  # its rows live in the batch
                self.rows.append(Row(decoding, ks[i], decoding.context()))

    def round(self) -> list[Decoding]:
        """One round for every row; returns the generations that ended (and left the batch). Compute
        thread."""
        asked = [(row, row.decoding.next_k(row.k)) for row in self.rows]
        ended = [row for row, k in asked if k is None]
        for row in ended:
            self._leave(row)
        if not self.rows:
            return [row.decoding for row in ended]
        ks = [k for _, k in asked if k is not None]
        t0 = time.perf_counter_ns()
        passes = self._draft(max(ks))
        t1 = time.perf_counter_ns()
        verdicts = self._verify(ks)
        t2 = time.perf_counter_ns()
        self.rounds += 1
        self.widest = max(self.widest, len(self.rows))
        for row, k, (accepted, token) in zip(list(self.rows), ks, verdicts, strict=True):
            block = DraftBlock(row.drafts[:k], row.dists[:k] if row.dists else None, passes, t1 - t0)
            kept = row.drafts[:accepted]
            row.blocks += 1 if k else 0
            row.tokens.extend([*kept, token])
            if not row.decoding.settle(k, block, kept, token, (t0, t1, t2), 0):
                ended.append(row)
                self._leave(row)
        return [row.decoding for row in ended]

    def release(self) -> Decoding:
        """The batch's one row, handed back to run alone: its target cache a KV cache of its own again
        (``Decoding.rebind``), its draft source left to the caller. Compute thread."""
        (row,) = self.rows
        row.decoding.rebind(own_cache(self.target.model, self.target_layout.row(0)))
        self._leave(row)
        return row.decoding

    def close(self) -> None:
        """Drop every row (each generation's own ``close`` still ends it)."""
        for row in list(self.rows):
            self._leave(row)

    def _leave(self, row: Row) -> None:
        b = self.rows.index(row)
        self.rows.pop(b)
        self.target_layout.remove(b)
        self.draft_layout.remove(b)

    def _draft_context(self, tokens: list[int]) -> list[LayerRow] | None:
        """The draft's cache rows after ``tokens`` but the last, prefilled (from its prompt cache)."""
        assert self.draft is not None
        draft_cache = make_prompt_cache(self.draft.model)
        prefill_cached(self.draft.model, draft_cache, tokens[:-1], self.draft_prompts)
        return kv_rows(draft_cache)

    def _catch_up(self) -> None:
        """Prefill, each alone, the draft context of rows more than ``CATCH_UP`` tokens behind (those that
        drafted nothing so far): one batched pass would pad every row to the longest gap."""
        held = self.draft_layout.lengths()
        behind = [b for b, row in enumerate(self.rows) if len(row.tokens) - held[b] > CATCH_UP]
        if behind:
            rows = [self.draft_layout.row(b) for b in range(len(self.rows))]
            for b in behind:
                rows[b] = self._draft_context(self.rows[b].tokens)
            self.draft_layout.rebuild(rows)

    def _draft(self, k: int) -> int:
        """Draft ``k`` tokens for every row (``row.drafts``, and ``row.dists`` when it samples); returns
        the passes run. The draft cache then holds each row's tokens and its drafts but the last."""
        for row in self.rows:
            row.drafts, row.dists = [], []
        self._draft_states = []
        if k == 0 or self.draft is None:
            return 0
        self._catch_up()
        held = self.draft_layout.lengths()
        feeds = [row.tokens[n:] for row, n in zip(self.rows, held, strict=True)]
        recurrent = self.draft_layout.recurrent
        sampled = [not row.decoding.params.greedy for row in self.rows]
        rngs = [np.random.default_rng([r.decoding.params.seed, DRAFT_STREAM, r.blocks]) for r in self.rows]
        for _ in range(k):
            width = max(len(feed) for feed in feeds)
            inputs = mx.array([feed + [0] * (width - len(feed)) for feed in feeds])
            self.draft_layout.begin(width)
            ragged = len({len(feed) for feed in feeds}) > 1
            for layer in recurrent if ragged else ():  # each row's state stops at its own last token
                layer.lengths = mx.array([len(feed) for feed in feeds])
            logits = _call(self.draft.model, inputs, self.draft_cache, defer=True)
            last = logits[mx.arange(len(feeds)), mx.array([len(feed) - 1 for feed in feeds])]
            choices = mx.argmax(last, axis=-1)
            on_host = any(sampled) or any(row.decoding.processing for row in self.rows)
            rows = last.astype(mx.float32) if on_host else None
            _settle(self.draft.model, choices, *([rows] if rows is not None else []))
            self.draft_layout.commit(width, [len(feed) for feed in feeds])
            for layer in recurrent:
                layer.lengths = None
            if recurrent:
                self._draft_states.append([(layer.cache[0], layer.cache[1]) for layer in recurrent])
            greedy = np.array(choices).tolist()
            host = np.array(rows) if rows is not None else None
            for b, row in enumerate(self.rows):
                processing = row.decoding.processing
                if sampled[b] or processing is not None:  # as the verdict will be: processed on the host
                    assert host is not None
                    scores = processing.row(host[b], row.drafts) if processing is not None else host[b]
                    token, dist = choose_draft_token(scores, row.decoding.params, rngs[b])
                    if dist is not None:
                        row.dists.append(dist)
                else:
                    token = int(greedy[b])
                row.drafts.append(token)
            feeds = [[row.drafts[-1]] for row in self.rows]
        return k

    def _verify(self, ks: list[int]) -> list[tuple[int, int]]:
        """The target's pass over every row's pending token and drafts; each row's verdict (drafts
        accepted, the target's token), its cache keeping what it accepted."""
        fed = [[row.tokens[-1], *row.drafts[:k]] for row, k in zip(self.rows, ks, strict=True)]
        width = max(len(f) for f in fed)
        self.target_layout.begin(width)
        inputs = mx.array([f + [0] * (width - len(f)) for f in fed])
        kept_states: dict[int, Any] = {}
        if self.target_layout.recurrent:  # every position's recurrent state, to take each row's back
            started = time.perf_counter()
            logits, kept_states = forward_keeping_states(self.target.model, inputs, self.target_cache)
            computed = (logits, self.target_cache, list(kept_states.values()))
            hold_pass(self.target.model, started, width, *computed, sequences=len(fed))
        else:
            logits = _call(self.target.model, inputs, self.target_cache)
        choices = np.array(mx.argmax(logits, axis=-1)).tolist()
        on_host = any(not row.decoding.params.greedy or row.decoding.processing for row in self.rows)
        host = np.array(logits.astype(mx.float32)) if on_host else None
        verdicts = []
        for b, (row, k) in enumerate(zip(self.rows, ks, strict=True)):
            decoding, drafts = row.decoding, row.drafts[:k]
            rows: Any = host[b, : k + 1] if host is not None else None
            if decoding.processing is not None:  # the request's penalties and grammar, position by position
                rows = ProcessedRows(rows, decoding.processing, chain_suffix(drafts))
            if decoding.params.greedy:
                chosen = Choices(rows) if decoding.processing is not None else choices[b][: k + 1]
                verdict = accept_greedy(chosen, drafts)
            else:
                verdict = accept_sampled(rows, drafts, row.dists[:k], decoding.params, decoding.rng)
            if decoding.processing is not None:
                accepted, token = verdict
                decoding.processing.record(
                    [rows[i] for i in range(accepted + 1)], [*drafts[:accepted], token]
                )
            verdicts.append(verdict)
        self.target_layout.commit(width, [accepted + 1 for accepted, _ in verdicts])
        for i, layer in enumerate(self.target_cache):  # each row's state after its accepted tokens
            if isinstance(layer, RowStates):
                layer.set_rows(
                    [row_of(kept_states[i][accepted], b) for b, (accepted, _) in enumerate(verdicts)]
                )
        drafted = len(self.rows[0].drafts) if self.rows else 0
        passes = [min(accepted, max(drafted - 1, 0)) for accepted, _ in verdicts]
        for b, (row, kept) in enumerate(zip(self.rows, passes, strict=True)):
            # The draft cache holds the row's tokens and its drafts but the last: keep the accepted ones.
            self.draft_layout.truncate(b, len(row.tokens) + kept)
        if drafted and self._draft_states and any(kept != drafted - 1 for kept in passes):
            for j, layer in enumerate(self.draft_layout.recurrent):  # the state after its kept pass
                layer.set_rows([row_of(self._draft_states[kept][j], b) for b, kept in enumerate(passes)])
        self.target_layout.tidy()
        self.draft_layout.tidy()
        return verdicts


def batch_refusal(target: LoadedModel, draft: LoadedModel | None) -> str | None:
    """Why ``target`` and ``draft`` (None: the target alone) cannot decode a batch, in one line; None when
    they can."""
    for model in (target, draft) if draft is not None else (target,):
        if not batchable(model.model):
            return (
                f"{model.spec} has a layer that is neither a KV cache nor a dense Qwen3.5 Gated DeltaNet "
                "layer (a windowed, quantized or other recurrent cache)"
            )
    _, cache = ragged_cache(target.model)
    if any(isinstance(layer, RowStates) for layer in cache) and not keeps_states(target.model, cache):
        return f"{target.spec}: its recurrent layers cannot keep a state by position"
    return None


def _call(model: Any, inputs: mx.array, cache: list, defer: bool = False) -> mx.array:
    """One pass of ``model`` over ``inputs`` (lazy when a paced pass is deferred: ``_settle`` it)."""
    if defer and hasattr(model, "settle"):
        return model(inputs, cache=cache, defer=True)
    return model(inputs, cache=cache)


def _settle(model: Any, *arrays: mx.array) -> None:
    """Compute a deferred pass's results, inside its paced time when ``model`` is paced."""
    if hasattr(model, "settle"):
        model.settle(*arrays)
    else:
        mx.eval(*arrays)
