"""The drafter: a draft model, its KV cache and its sampler, for one generation session.

Local drafting on the coordinator, every session on a worker, and a worker's
pre-speculation all use this one class, so they draft the same tokens from
the same state. The drafter keeps the accepted ``context`` and the exact
token sequence its KV cache holds (``cached``). Any forward pass first trims
the cache to the longest prefix it shares with the sequence being extended
(mlx-lm's trimmable-cache helper), then feeds the rest in one batch. So the
cache may wander onto a speculative branch and come back: reaching any state
costs at most one batched pass.

A ``Drafting`` is one block of k drafts after a prefix, produced one or more
passes at a time, so a worker can interleave it with other work and stop
between passes. Its last draft is never fed. ``Drafter.draft`` runs one to
the end after the current context; ``adopt`` takes a finished block as the
session's drafts and refuses a block drafted after any other prefix.

Each block's randomness comes from its own generator, seeded by (seed,
block index). A block drafted ahead of time for the real prefix is therefore
token for token the block that would be drafted on demand.

All MLX work here runs on the caller's thread; callers keep it on their
process's single compute thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from specwire.drafting.choices import likeliest, top_choices
from specwire.drafting.draft_block import DraftBlock
from specwire.drafting.prefix_cache import PrefixCache, Reuse, shared_prefix
from specwire.drafting.rollback import Checkpoints
from specwire.drafting.sampling import (
    SamplingParams,
    SparseDistribution,
    choose_draft_token,
    draft_distribution,
    skip_draws,
)
from specwire.errors import InvalidArgumentError

if TYPE_CHECKING:
    from specwire.logits.processors import Processing

PREFILL_STEP = 512
# Seeds are (seed, stream, ...): the verifier draws from stream 1, draft blocks from stream 2,
# so a block's draws never coincide with the acceptance test's.
DRAFT_STREAM = 2


class RowBatch(Protocol):
    """A batch a block was drafted in as one of its rows (``specwire.drafting.ahead.branch_batch``)."""

    def cache_of(self, block: Drafting) -> list[Any] | None:
        """The cache of ``block``'s row, to adopt as the drafter's own (None: none to take)."""
        ...


class LanguageModel(Protocol):
    """What the drafter needs of a model: mlx-lm's calling convention (and its cache hooks)."""

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array: ...


def prefill(
    model: LanguageModel,
    cache: list,
    tokens: Sequence[int],
    step: int = PREFILL_STEP,
    checkpoints: Checkpoints | None = None,
    start: int = 0,
) -> int:
    """Run ``tokens`` through ``model`` into ``cache`` (which holds ``start`` tokens) in chunks.

    Returns the forward passes used; with ``checkpoints``, the state after each chunk is kept.
    """
    passes = 0
    for first in range(0, len(tokens), step):
        chunk = list(tokens[first : first + step])
        model(mx.array([chunk]), cache=cache)
        mx.eval([c.state for c in cache])
        passes += 1
        if checkpoints is not None:
            checkpoints.keep(start + first + len(chunk))
    return passes


def prefill_cached(
    model: LanguageModel,
    cache: list,
    tokens: Sequence[int],
    prefix_cache: PrefixCache | None,
    scope: str = "",
    checkpoints: Checkpoints | None = None,
) -> tuple[int, Reuse]:
    """``prefill`` into the fresh ``cache``, starting from ``prefix_cache``'s longest usable entry of
    ``scope`` and keeping the result there; returns the passes run and what was reused."""
    reuse = prefix_cache.restore(cache, tokens, scope) if prefix_cache is not None else Reuse()
    if checkpoints is not None and reuse.cached:
        checkpoints.keep(reuse.cached)
    passes = prefill(model, cache, tokens[reuse.cached :], checkpoints=checkpoints, start=reuse.cached)
    if prefix_cache is not None and len(tokens) > reuse.cached:
        prefix_cache.store(tokens, cache, scope)
    return passes, reuse


class Drafting:
    """k drafts after ``prefix``, drafted a pass or more at a time; see the module docstring.

    ``alternatives`` > 0 also keeps, for every position, the draft's
    ``alternatives`` most probable tokens with their probabilities (its
    sparse q when sampling), which pre-speculation uses to guess outcomes.
    """

    def __init__(
        self, drafter: Drafter, prefix: Sequence[int], k: int, index: int, alternatives: int = 0
    ) -> None:
        self.drafter = drafter
        self.prefix = list(prefix)
        self.k = k
        self.index = index
        self.alternatives = alternatives
        self.rng = drafter.block_rng(index)
        self.tokens: list[int] = []
        self.dists: list[SparseDistribution] = []
        self.candidates: list[SparseDistribution] = []
        self.forward_passes = 0
        self.compute_ns = 0
        self.batch: RowBatch | None = None  # set when drafted as a row of a batch

    @property
    def done(self) -> bool:
        """True once all k drafts are in hand."""
        return len(self.tokens) >= self.k

    def resume(self, tokens: Sequence[int], dists: Sequence[SparseDistribution] | None) -> None:
        """Take ``tokens`` (and their q when sampling) as this block's first drafts, drafted elsewhere.

        They must come from the same block (prefix and index) drafted by the
        same model: the generator skips their draws, so the drafts that
        follow are those the other drafter would make next.
        """
        if self.tokens:
            raise InvalidArgumentError("a block resumes from drafts made elsewhere only before drafting")
        self.tokens = list(tokens)
        if not self.drafter.params.greedy:
            self.dists = list(dists or [])
            skip_draws(self.rng, len(self.tokens))

    def advance(self, passes: int | None = None) -> None:
        """Run up to ``passes`` more forward passes (all that remain when None)."""
        n = self.k - len(self.tokens) if passes is None else min(passes, self.k - len(self.tokens))
        if n <= 0:
            return
        self.batch = None  # drafted on from the drafter's own cache from here
        t0 = time.perf_counter_ns()
        drafter = self.drafter
        if drafter.params.greedy and drafter.processing is None:
            drafter.greedy_passes(self, n)
        else:
            drafter.sampled_passes(self, n)
        self.forward_passes += n
        self.compute_ns += time.perf_counter_ns() - t0

    def block(self, k: int | None = None) -> DraftBlock:
        """The first ``k`` drafts (all by default) as a block."""
        k = self.k if k is None else k
        dists = self.dists[:k] if not self.drafter.params.greedy else None
        return DraftBlock(list(self.tokens[:k]), dists, self.forward_passes, self.compute_ns)


class Drafter:
    """Drafts tokens for one session; see the module docstring for the cache invariant."""

    def __init__(self, model: LanguageModel, params: SamplingParams) -> None:
        self.model = model
        self.params = params
        self.cache = make_prompt_cache(model)  # type: ignore[arg-type]  # mlx-lm only calls make_cache or reads layers
        self.checkpoints = Checkpoints(self.cache)  # recurrent layers' states after each pass
        self.context: list[int] = []
        self.cached: list[int] = []
        self.last_drafts: list[int] = []
        self.blocks = 0
        self.forward_passes = 0
        self._adopted: Drafting | None = None  # a branch drafted in a batch, its cache not yet taken
        self.reuse = Reuse()  # what the prompt cache gave the last start
        # The request's penalties and grammar, applied to each draft as the target applies them to its
        # verdict (the drafts stay acceptable); drafts are then chosen on the host, a pass at a time.
        self.processing: Processing | None = None

    def block_rng(self, index: int) -> np.random.Generator:
        """The generator of block ``index``: fresh, and the same wherever that block is drafted."""
        return np.random.default_rng([self.params.seed, DRAFT_STREAM, index])

    def start(self, prompt: Sequence[int], prefix_cache: PrefixCache | None = None, scope: str = "") -> int:
        """Prefill all prompt tokens but the last, from ``prefix_cache``'s longest usable entry when it
        has one (``self.reuse`` says what it reused); returns the compute time in ns."""
        if not prompt:
            raise InvalidArgumentError("the prompt must hold at least one token")
        t0 = time.perf_counter_ns()
        self.context = list(prompt)
        fed = self.context[:-1]
        self.checkpoints.keep(0)
        passes, self.reuse = prefill_cached(
            self.model, self.cache, fed, prefix_cache, scope, self.checkpoints
        )
        self.forward_passes += passes
        self.cached = fed
        return time.perf_counter_ns() - t0

    def keep(self, prefix_cache: PrefixCache, scope: str = "") -> None:
        """Keep the cache at the context in ``prefix_cache``, so that a drafter taking over on the same model
        prefills only what follows; drafts fed after the context are rolled back first (``_reuse``, as the
        next pass would)."""
        self._reuse(self.context)
        prefix_cache.store(self.cached, self.cache, scope)

    def apply(self, accepted: int, token: int, appended: Sequence[int] | None = None) -> list[int]:
        """Record the target's verdict on the last block: ``accepted`` drafts, then ``token``.

        ``appended`` (the accepted tokens and ``token``) is given when the
        verified drafts may have come from another drafter; the context then
        takes exactly those tokens, and ``accepted`` may exceed this
        drafter's own drafts (the rest were drafted elsewhere). Returns the tokens appended.
        """
        if accepted < 0 or (not appended and accepted > len(self.last_drafts)):
            raise InvalidArgumentError(
                f"accepted count {accepted} is outside 0..{len(self.last_drafts)} "
                "(the drafts of the last round)"
            )
        settled = len(self.context) - 1  # every later sequence starts with the context: no rollback before
        tokens = self.verdict_tokens(accepted, token, appended)
        self.context.extend(tokens)
        self.last_drafts = []
        self.checkpoints.forget_before(settled)
        return tokens

    def verdict_tokens(self, accepted: int, token: int, appended: Sequence[int] | None = None) -> list[int]:
        """The tokens a verdict appends to the context."""
        if not appended:
            return [*self.last_drafts[:accepted], token]
        if len(appended) != accepted + 1 or appended[-1] != token:
            raise InvalidArgumentError(
                f"appended tokens must be the {accepted} accepted drafts and then the token {token}"
            )
        return list(appended)

    def drafting(self, k: int, alternatives: int = 0) -> Drafting:
        """The next block: ``k`` drafts after the context, not yet drafted."""
        return Drafting(self, self.context, k, self.blocks, alternatives)

    def adopt(self, block: Drafting, k: int | None = None) -> DraftBlock:
        """Take the first ``k`` drafts of a finished block as this round's drafts."""
        k = block.k if k is None else k
        if block.prefix != self.context or len(block.tokens) < k:
            raise InvalidArgumentError("a draft block may only be used for the prefix it was drafted after")
        out = block.block(k)
        self.last_drafts = out.tokens
        self.blocks += 1
        self._adopted = block if block.batch is not None else None
        return out

    def draft(self, k: int, alternatives: int = 0) -> DraftBlock:
        """Draft ``k`` tokens after the current context."""
        if k == 0:
            self.last_drafts = []
            return DraftBlock([], None, 0, 0)
        block = self.drafting(k, alternatives)
        block.advance()
        return self.adopt(block)

    def distribution_after(self, sequence: Sequence[int], size: int) -> SparseDistribution:
        """The draft's ``size`` most probable next tokens after ``sequence`` (one pass, no sampling)."""
        return _first(self.distributions_after(sequence, 1, size)[0], size)

    def distributions_after(self, sequence: Sequence[int], count: int, size: int) -> list[SparseDistribution]:
        """The draft's next-token distribution after each of the last ``count`` prefixes of ``sequence``.

        One pass: prefix i < count - 1 is the one the (count - 1 - i)-th last token was drafted after,
        the last is ``sequence`` whole. At T = 0 each is the ``size`` most probable tokens; when
        sampling, the truncated q a draft is drawn from. The cache then holds ``sequence``.
        """
        sequence = list(sequence)
        keep = self._reuse(sequence[: len(sequence) - count + 1])
        rows = self._pass(mx.array([sequence[keep:]]))[0, -count:]
        self.cached.extend(sequence[keep:])
        self.checkpoints.keep(len(self.cached))
        self.forward_passes += 1
        if self.params.greedy:
            ids, probs = top_choices(rows.astype(mx.float32), size)  # every row in one go, ranked
            self._settle(ids, probs)
            return _sparse_rows(ids, probs)
        rows = rows.astype(mx.float32)
        self._settle(rows)
        host = np.array(rows)
        return [draft_distribution(host[i], self.params) for i in range(count)]

    # Forward passes; each trims the cache to what it shares with the sequence first.

    def _reuse(self, sequence: list[int]) -> int:
        """Roll the cache back to its longest prefix shared with ``sequence`` (leaving one token to feed).

        With recurrent layers, back to the furthest kept state within that prefix
        (the state after a pass); the tokens after it are fed again.
        """
        self._install_adopted()
        keep = self.checkpoints.nearest(min(shared_prefix(self.cached, sequence), len(sequence) - 1))
        if keep < len(self.cached):
            self.checkpoints.rewind(len(self.cached), keep)
            del self.cached[keep:]
        return keep

    def _forward(self, sequence: list[int]) -> mx.array:
        """Logits after ``sequence`` (lazy: ``_settle`` what you derive from them); the cache holds it all."""
        keep = self._reuse(sequence)
        logits = self._pass(mx.array([sequence[keep:]]))[0, -1]
        self.cached.extend(sequence[keep:])
        self.checkpoints.keep(len(self.cached))
        return logits

    def _pass(self, inputs: mx.array) -> mx.array:
        """One forward pass (lazy); a paced model holds it only once ``_settle`` computed its results."""
        return self.batch_pass(inputs, self.cache)

    def hold(self, sequence: list[int]) -> list:
        """The cache, made to hold ``sequence`` (feeding what it lacks in one pass); compute thread."""
        keep = self._reuse([*sequence, 0])
        if keep < len(sequence):
            self._pass(mx.array([sequence[keep:]]))
            self._settle(*[layer.state[0] for layer in self.cache])
            self.forward_passes += 1
            self.cached.extend(sequence[keep:])
            self.checkpoints.keep(len(self.cached))
        return self.cache

    def batch_pass(self, inputs: mx.array, cache: list) -> mx.array:
        """One forward pass over ``inputs`` into ``cache`` (lazy; then ``settle`` what it gives)."""
        if self._paced:
            paced: Any = self.model  # specwire.emulation.pace.PacedModel
            return paced(inputs, cache=cache, defer=True)
        return self.model(inputs, cache=cache)

    def settle(self, *arrays: mx.array) -> None:
        """Compute a pass's results (``batch_pass``): inside its paced time for a paced model."""
        self._settle(*arrays)

    def _install_adopted(self) -> None:
        """Take the cache of an adopted branch drafted in a batch as this drafter's own (compute thread).

        Its row holds the branch's prefix and drafts but the last, as this
        cache would after drafting the branch itself; no token is fed again.
        """
        block, self._adopted = self._adopted, None
        if block is None or block.batch is None:
            return
        layers = block.batch.cache_of(block)
        if layers is None:
            return
        for i, layer in enumerate(layers):
            self.cache[i] = layer
        self.cached = (block.prefix + block.tokens)[: layers[0].offset]

    def _settle(self, *arrays: mx.array) -> None:
        """Compute a pass's results: inside its paced time for a paced model, otherwise queued."""
        if self._paced:
            self.model.settle(*arrays)  # type: ignore[attr-defined]
        else:
            mx.async_eval(*arrays)

    @property
    def _paced(self) -> bool:
        return hasattr(self.model, "settle")

    def greedy_passes(self, block: Drafting, n: int) -> None:
        """Extend ``block`` by ``n`` argmax drafts."""
        sequence = block.prefix + block.tokens
        keep = self._reuse(sequence)
        feed = sequence[keep:]
        chain = getattr(self.model, "greedy_chain", None)
        if chain is not None and not block.alternatives:
            # A remote executor that runs the whole greedy round at once.
            tokens = list(chain(feed, n, self.cache))
            for i in range(n):  # the worker keeps its state after each chained pass
                self.checkpoints.keep(keep + len(feed) + i)
        else:
            tokens = self._greedy_chain(block, feed, n, keep + len(feed))
        self.cached.extend(feed + tokens[:-1])
        block.tokens.extend(tokens)
        self.forward_passes += n

    def _greedy_chain(self, block: Drafting, feed: list[int], n: int, position: int) -> list[int]:
        # The argmax stays in the graph, so MLX can run ahead without a host sync per token.
        y = mx.array([feed])
        out, tops = [], []
        for i in range(n):
            logits = self._pass(y)[:, -1, :]
            self.checkpoints.keep(position + i)  # the state after this pass's tokens
            token = mx.argmax(logits, axis=-1)
            if block.alternatives:
                tops.append(top_choices(logits.astype(mx.float32), block.alternatives))
            self._settle(token, *(tops[-1] if block.alternatives else ()))
            out.append(token)
            if i + 1 < n:
                y = token[None]
        tokens = np.array(mx.concatenate(out)).astype(int).tolist()
        block.candidates.extend(top for ids, probs in tops for top in _sparse_rows(ids, probs))
        return tokens

    def sampled_passes(self, block: Drafting, n: int) -> None:
        """Extend ``block`` by ``n`` drafts sampled from the truncated q with the block's generator (or,
        greedy with ``processing``, the processed argmax), a pass and a host read each. ``processing``
        has accepted the context: a block's suffix is what its prefix adds to it (a branch's verdict),
        then its drafts."""
        ahead = block.prefix[len(self.context) :] if self.processing is not None else []
        for _ in range(n):
            sequence = block.prefix + block.tokens
            row = self._forward(sequence).astype(mx.float32)
            self._settle(row)
            logits = np.array(row)
            if self.processing is not None:
                logits = self.processing.row(logits, [*ahead, *block.tokens])
            token, dist = choose_draft_token(logits, self.params, block.rng)
            if dist is not None:
                block.dists.append(dist)
                if block.alternatives:
                    block.candidates.append(dist)
            elif block.alternatives:  # greedy under processing: the processed row's likeliest
                block.candidates.append(likeliest(logits, block.alternatives)[0])
            # The token goes last: a reader on another thread may take every token it sees.
            block.tokens.append(token)
        # The last draft is never fed: the cache holds everything before it.
        self.forward_passes += n


def _first(dist: SparseDistribution, size: int) -> SparseDistribution:
    return SparseDistribution(dist.ids[:size], dist.probs[:size])


def _sparse_rows(ids: mx.array, probs: mx.array) -> list[SparseDistribution]:
    """Each row's candidates on the host, most probable first as ``top_choices`` ranks them."""
    ids_np, probs_np = np.array(ids).astype(np.int64), np.array(probs, dtype=np.float64)
    return [SparseDistribution(i, p) for i, p in zip(ids_np, probs_np, strict=True)]
