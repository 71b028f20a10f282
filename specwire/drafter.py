"""The drafter: a draft model, its KV cache and its sampler, for one generation session.

Local drafting on the coordinator and every session on a worker use this one
class, so both draft the same tokens from the same state. The drafter keeps
the accepted context and tracks exactly which tokens its cache holds:

    cache = context[:n_cached] + fed_drafts

Drafting k tokens feeds the pending context tokens and the first k - 1 drafts;
the last draft is never fed. ``apply(accepted, token)`` keeps the fed drafts
the target accepted, trims the rest with mlx-lm's trimmable-cache helper, and
appends the target's token to the context. The next ``draft`` feeds whatever
the cache lacks (one token, or two after a full acceptance) in one pass.

All MLX work here runs on the caller's thread; callers keep it on their
process's single compute thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from specwire.errors import InvalidArgumentError
from specwire.sampling import SamplingParams, SparseDistribution, choose_draft_token
from specwire.timing import CallRecord

PREFILL_STEP = 512


class LanguageModel(Protocol):
    """What the drafter needs of a model: mlx-lm's calling convention (and its cache hooks)."""

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array: ...


@dataclass
class DraftBlock:
    """k drafted tokens, the sparse q of each when sampling, and what producing them cost.

    ``calls`` holds one record per remote call that brought the drafts (empty
    when drafting locally).
    """

    tokens: list[int]
    dists: list[SparseDistribution] | None
    forward_passes: int
    compute_ns: int
    calls: list[CallRecord] = field(default_factory=list)


def prefill(model: LanguageModel, cache: list, tokens: Sequence[int], step: int = PREFILL_STEP) -> int:
    """Run ``tokens`` through ``model`` into ``cache`` in chunks; returns forward passes used."""
    passes = 0
    for start in range(0, len(tokens), step):
        model(mx.array([list(tokens[start : start + step])]), cache=cache)
        mx.eval([c.state for c in cache])
        passes += 1
    return passes


class Drafter:
    """Drafts tokens for one session; see the module docstring for the cache invariant."""

    def __init__(self, model: LanguageModel, params: SamplingParams) -> None:
        self.model = model
        self.params = params
        self.cache = make_prompt_cache(model)  # type: ignore[arg-type]  # mlx-lm only calls make_cache or reads layers
        self.rng = np.random.default_rng(params.seed)
        self.context: list[int] = []
        self.n_cached = 0
        self.fed_drafts: list[int] = []
        self.last_drafts: list[int] = []
        self.forward_passes = 0

    def start(self, prompt: Sequence[int]) -> int:
        """Prefill all prompt tokens but the last; returns the compute time in ns."""
        if not prompt:
            raise InvalidArgumentError("the prompt must hold at least one token")
        t0 = time.perf_counter_ns()
        self.context = list(prompt)
        self.forward_passes += prefill(self.model, self.cache, self.context[:-1])
        self.n_cached = len(self.context) - 1
        return time.perf_counter_ns() - t0

    def apply(self, accepted: int, token: int) -> None:
        """Record the target's verdict on the last block: ``accepted`` drafts, then ``token``."""
        if not 0 <= accepted <= len(self.last_drafts):
            raise InvalidArgumentError(
                f"accepted count {accepted} is outside 0..{len(self.last_drafts)} "
                "(the drafts of the last round)"
            )
        kept = min(accepted, len(self.fed_drafts))
        trim_prompt_cache(self.cache, len(self.fed_drafts) - kept)
        self.n_cached += kept
        self.context.extend(self.last_drafts[:accepted])
        self.context.append(token)
        self.fed_drafts = []
        self.last_drafts = []

    def draft(self, k: int) -> DraftBlock:
        """Draft ``k`` tokens after the current context."""
        t0 = time.perf_counter_ns()
        if k == 0:
            self.last_drafts = []
            return DraftBlock([], None, 0, 0)
        feed = self.context[self.n_cached :]
        if self.params.greedy:
            tokens, dists = self._draft_greedy(feed, k), None
        else:
            tokens, dists = self._draft_sampled(feed, k)
        self.n_cached = len(self.context)
        self.fed_drafts = tokens[:-1]
        self.last_drafts = tokens
        self.forward_passes += k
        return DraftBlock(tokens, dists, k, time.perf_counter_ns() - t0)

    def _draft_greedy(self, feed: list[int], k: int) -> list[int]:
        chain = getattr(self.model, "greedy_chain", None)
        if chain is not None:  # a remote executor that runs the whole greedy round at once
            return list(chain(feed, k, self.cache))
        # The argmax stays in the graph, so MLX can run ahead without a host sync per token.
        y = mx.array([feed])
        out = []
        for i in range(k):
            token = mx.argmax(self.model(y, cache=self.cache)[:, -1, :], axis=-1)
            mx.async_eval(token)
            out.append(token)
            if i + 1 < k:
                y = token[None]
        return np.array(mx.concatenate(out)).astype(int).tolist()

    def _draft_sampled(self, feed: list[int], k: int) -> tuple[list[int], list[SparseDistribution]]:
        tokens: list[int] = []
        dists: list[SparseDistribution] = []
        y = feed
        for _ in range(k):
            logits = self.model(mx.array([y]), cache=self.cache)[0, -1].astype(mx.float32)
            token, dist = choose_draft_token(np.array(logits), self.params, self.rng)
            assert dist is not None
            tokens.append(token)
            dists.append(dist)
            y = [token]
        return tokens, dists
