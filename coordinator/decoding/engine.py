"""The speculative decoding engine: one loop for local drafting, remote drafting and AR.

Each round:

1. ask the draft source for k drafts (a remote source makes one call);
2. run the target once over [last token, d_1 .. d_k], k + 1 positions in one
   batched forward pass;
3. accept a prefix of the drafts and take the target's correction, or its
   bonus token when all k were accepted (``coordinator.decoding.acceptance``);
   a source may draft a tree instead (``DraftBlock.tree``): the pass then
   covers every node, each seeing only its ancestors, and the longest path
   the target agrees with is accepted;
4. roll the rejected positions back out of the target's cache: trimmed from
   KV caches, restored or replayed for recurrent layers
   (``coordinator.decoding.rollback``); the draft source rolls back its own
   on the next round.

k = 0, or no draft source, is plain autoregressive decoding through the same
code. Generation stops at an EOS token (not emitted), at ``max_tokens``, or
when the caller sets ``halt`` (checked before each round; the server sets it
when a stop sequence matched or the client left).
The engine keeps a record per round for the benchmarks.

A draft source that steers (``Steering``: the drafting policy,
``coordinator.drafting.auto``) says each round's k, 0 for an autoregressive
round in which it is not asked, and learns from every round's record.

Model compute runs on the calling thread; callers keep all MLX work of a
process on one thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from coordinator.decoding.acceptance import (
    accept_greedy,
    accept_sampled,
    accept_tree_greedy,
    accept_tree_sampled,
)
from coordinator.decoding.results import GenerationResult, RoundRecord
from coordinator.decoding.rollback import Rollback, warm_states
from coordinator.drafting.base import DraftSource, Outcome, offer_processing
from specwire.drafting.drafter import DraftBlock, prefill_cached
from specwire.drafting.prefix_cache import PrefixCache, Reuse
from specwire.drafting.sampling import SamplingParams
from specwire.drafting.token_tree import TokenTree
from specwire.drafting.warmup import warm_drafter, warm_target
from specwire.errors import InvalidArgumentError, UnsupportedModelError
from specwire.logits.processors import Choices, ProcessedRows, Processing, chain_suffix, tree_suffix
from specwire.models.loading import LoadedModel
from specwire.wire.protocol import MAX_TREE_NODES

MAX_K = 32
VERIFY_STREAM = 1  # the acceptance test's random stream; draft blocks use 2 (specwire.drafting.drafter)


__all__ = ["Decoding", "GenerationResult", "RoundRecord", "SpeculativeDecoder", "Steering"]


@runtime_checkable
class Steering(Protocol):
    """A draft source that chooses each round's k (0: the round is autoregressive) and learns from it."""

    def k_now(self, left: int) -> int:
        """Drafts the next round asks for, with ``left`` tokens still to generate."""
        ...

    def record(self, record: RoundRecord) -> None:
        """Learn from one finished round."""
        ...


def check_k(k: int) -> None:
    """Raise ``InvalidArgumentError`` unless ``k`` is a draft count a round may ask for (0..MAX_K)."""
    if not 0 <= k <= MAX_K:
        raise InvalidArgumentError(f"k must be within 0..{MAX_K}, got {k}")


class SpeculativeDecoder:
    """Generates with a target model, drafting through an optional draft source.

    Every round asks for the same k, unless the source steers (``Steering``).
    """

    def __init__(
        self,
        target: LoadedModel,
        source: DraftSource | None = None,
        rollback: str = "auto",
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.target = target
        self.source = source
        self.rollback = rollback
        self.prefix_cache = prefix_cache  # the target's prompt cache across generations (serve)

    def generate(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        k: int,
        params: SamplingParams,
        on_tokens: Callable[[list[int]], None] | None = None,
        halt: threading.Event | None = None,
        processing: Processing | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_tokens`` tokens after ``prompt``; stop early once ``halt`` is set."""
        decoding = self.begin(
            prompt,
            max_tokens=max_tokens,
            k=k,
            params=params,
            on_tokens=on_tokens,
            halt=halt,
            processing=processing,
        )
        try:
            while decoding.round():
                pass
        finally:
            decoding.close()
        return decoding.result

    def begin(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        k: int,
        params: SamplingParams,
        on_tokens: Callable[[list[int]], None] | None = None,
        halt: threading.Event | None = None,
        processing: Processing | None = None,
        prefill: bool = True,
    ) -> Decoding:
        """Start a generation (the draft source's session, the target's prefill), to run a round at a time.

        The caller runs ``round()`` until it returns False, then ``close()``s it whatever happened: ``serve``
        interleaves the rounds of several generations this way. ``processing`` (a request's penalties and
        grammar: ``specwire.logits.processors``) shapes the target's distribution at every position.
        ``prefill`` False leaves the prompt to the caller (``Decoding.prefill``, or a batch's
        ``DecodingBatch.admit``), with no draft source.
        """
        self._check(prompt, k)
        max_tokens = min(max_tokens, self.target.context_length - len(prompt))
        source = self.source if k > 0 and max_tokens > 1 and prefill else None
        start = time.perf_counter_ns()
        try:
            if source is not None:
                offer_processing(source, processing)  # its drafts processed as the verdict will be
                source.start(prompt, params, min(k, max_tokens - 1))
            decoding = Decoding(self, prompt, max_tokens, k, params, source, start, on_tokens, halt, prefill)
            decoding.processing = processing
            return decoding
        except BaseException:
            if source is not None:
                source.close()
            raise

    def _check(self, prompt: Sequence[int], k: int) -> None:
        if not prompt:
            raise InvalidArgumentError("the prompt must hold at least one token")
        check_k(k)
        if len(prompt) >= self.target.context_length:
            raise InvalidArgumentError(
                f"the prompt has {len(prompt)} tokens; "
                f"the target's context holds {self.target.context_length}"
            )

    def warm_up(self, k: int, params: SamplingParams, local_drafts: Sequence[LoadedModel] = ()) -> float:
        """Run every shape a round at up to ``k`` drafts uses, once; returns the seconds it took.

        The target's passes, and those of the draft models this process drafts
        with (a remote worker warms its own at start); for dense Qwen3.5, also
        the passes that keep states by position and by tree node. Call before timing
        anything: on a GPU the first use of each kernel compiles it
        (``specwire.drafting.warmup``).
        """
        check_k(k)  # a bad k is refused before a minute of warming on a GPU, not after
        seconds = warm_target(self.target.model, k)
        if k > 0:
            seconds += warm_states(self.target.model, k)  # a hybrid target's rollback and tree passes
            seconds += sum(warm_drafter(d.model, sampled=not params.greedy) for d in local_drafts)
            seconds += sum(warm_states(d.model, k) for d in local_drafts)  # a hybrid draft's tree levels
        return seconds

    def _verify(
        self,
        rollback: Rollback,
        pending: int,
        block: DraftBlock,
        params: SamplingParams,
        rng: np.random.Generator,
        processing: Processing | None = None,
    ) -> tuple[list[int], int, int]:
        """The accepted drafts, the target's token, and the ns rolling back the rest took."""
        if block.tree is not None:
            return self._verify_tree(rollback, pending, block.tree, params, rng, processing)
        drafts = block.tokens
        logits = rollback.verify([pending, *drafts])[0]
        if processing is not None:
            rows = ProcessedRows(np.array(logits.astype(mx.float32)), processing, chain_suffix(drafts))
            if params.greedy:
                accepted, token = accept_greedy(Choices(rows), drafts)
            else:
                accepted, token = accept_sampled(rows, drafts, block.dists or [], params, rng)
            processing.record([rows[i] for i in range(accepted + 1)], [*drafts[:accepted], token])
        elif params.greedy:
            accepted, token = accept_greedy(np.array(mx.argmax(logits, axis=-1)).tolist(), drafts)
        else:
            host = np.array(logits.astype(mx.float32))
            accepted, token = accept_sampled(host, drafts, block.dists or [], params, rng)
        return drafts[:accepted], token, rollback.keep_first(accepted + 1)

    def _verify_tree(
        self,
        rollback: Rollback,
        pending: int,
        tree: TokenTree,
        params: SamplingParams,
        rng: np.random.Generator,
        processing: Processing | None,
    ) -> tuple[list[int], int, int]:
        logits = rollback.verify_tree(pending, tree)[0]
        if processing is not None:
            rows = ProcessedRows(
                np.array(logits.astype(mx.float32)), processing, tree_suffix(tree.tokens, tree.path)
            )
            if params.greedy:
                path, token = accept_tree_greedy(Choices(rows), tree)
            else:
                path, token = accept_tree_sampled(rows, tree, params, rng)
            emitted = [*(tree.tokens[node] for node in path), token]
            processing.record([rows[0], *(rows[node + 1] for node in path)], emitted)
        elif params.greedy:
            path, token = accept_tree_greedy(np.array(mx.argmax(logits, axis=-1)).tolist(), tree)
        else:
            path, token = accept_tree_sampled(np.array(logits.astype(mx.float32)), tree, params, rng)
        return [tree.tokens[node] for node in path], token, rollback.keep_path(path)


class Decoding:
    """One generation in progress: the target's cache and rollback, the draft source, the result so far.

    Made by ``SpeculativeDecoder.begin``, which prefills the prompt (from the
    prompt cache, when there is one); each ``round()`` drafts, verifies and
    emits once. All of it runs on the thread that runs the models.
    """

    def __init__(
        self,
        decoder: SpeculativeDecoder,
        prompt: Sequence[int],
        max_tokens: int,
        k: int,
        params: SamplingParams,
        source: DraftSource | None,
        start: int,
        on_tokens: Callable[[list[int]], None] | None,
        halt: threading.Event | None,
        prefill: bool = True,
    ) -> None:
        self.decoder = decoder
        self.prompt = list(prompt)
        self.max_tokens = max_tokens
        self.k = k
        self.params = params
        self.source = source
        self.policy = source if isinstance(source, Steering) else None
        self.on_tokens = on_tokens
        self.halt = halt
        self.closed = False
        self.done = False
        target = decoder.target
        cache = make_prompt_cache(target.model)
        try:
            self.rollback = Rollback(target.model, cache, len(prompt) - 1, decoder.rollback)
        except UnsupportedModelError as err:
            raise UnsupportedModelError(f"{target.spec}: {err}") from err
        self.result = GenerationResult(len(prompt), [], "length", start, start, 0)
        self.result.rollback = self.rollback.stats
        self.prefilled = False
        if prefill:
            self.prefill()
        self.rng = np.random.default_rng([params.seed, VERIFY_STREAM])
        self.pending = int(prompt[-1])
        self.outcome: Outcome | None = None
        self.processing: Processing | None = None  # the request's penalties and grammar, if any
        self.stop_ids = target.eos_token_ids  # tokens that end the generation (none: a client's ignore_eos)

    def prefill(self) -> None:
        """Prefill the prompt but its last token into the target's cache (from the prompt cache)."""
        decoder = self.decoder
        fed = self.prompt[:-1]
        _, reuse = prefill_cached(decoder.target.model, self.rollback.cache, fed, decoder.prefix_cache)
        self.prefilled_by(reuse)

    def prefilled_by(self, reuse: Reuse) -> None:
        """Record the prompt's prefill, done here or elsewhere (``serve``'s batch prefills the prompts
        admitted together in one pass), and what it took from the prompt cache."""
        self.prefilled = True
        self.result.prefill_end_ns = time.perf_counter_ns()
        self.result.cached_tokens, self.result.cache_note = reuse.cached, reuse.why_not

    def round(self) -> bool:
        """Run one round; False once the generation has ended (its result is then complete)."""
        policy, source = self.policy, self.source
        k_round = self.next_k(policy.k_now(self.max_tokens - len(self.result.tokens)) if policy else self.k)
        if k_round is None:
            return False
        t0 = time.perf_counter_ns()
        # The last round (one token left) drafts nothing: the source is not asked.
        block = source.propose(k_round, self.outcome) if source and k_round else DraftBlock([], None, 0, 0)
        t1 = time.perf_counter_ns()
        if block.tree is not None:  # no deeper than k: every accepted path fits in max_tokens
            block.tree.check(self.decoder.target.vocab_size, MAX_TREE_NODES, k_round)
        kept, token, rollback_ns = self.decoder._verify(
            self.rollback, self.pending, block, self.params, self.rng, self.processing
        )
        return self.settle(k_round, block, kept, token, (t0, t1, time.perf_counter_ns()), rollback_ns)

    def next_k(self, k: int) -> int | None:
        """The drafts this round takes, at most ``k`` (fewer near ``max_tokens``); None once the
        generation has ended (at ``max_tokens``, or halted)."""
        if self.done:
            return None
        if len(self.result.tokens) >= self.max_tokens:
            self._end()
            return None
        if self.halt is not None and self.halt.is_set():
            self.result.finish_reason = "halted"
            self._end()
            return None
        return min(k, self.max_tokens - len(self.result.tokens) - 1)

    def settle(
        self,
        k_round: int,
        block: DraftBlock,
        kept: list[int],
        token: int,
        times: tuple[int, int, int],
        rollback_ns: int,
    ) -> bool:
        """Emit a verified round (the accepted drafts ``kept``, then the target's ``token``) and record it;
        False once the generation has ended. ``times``: the round's start, its drafts' and its verdict's
        ``perf_counter_ns``."""
        result, policy = self.result, self.policy
        t0, t1, t2 = times
        accepted = len(kept)
        emitted = [*kept, token]
        stop = next((i for i, t in enumerate(emitted) if t in self.stop_ids), None)
        if stop is not None:
            emitted = emitted[:stop]
            result.finish_reason = "eos"
        result.tokens.extend(emitted)
        result.token_ns.extend([t2] * len(emitted))
        if self.processing is not None:
            self.processing.accept(emitted)
        record = RoundRecord(k_round, accepted, emitted, t1 - t0, t2 - t1, t2, block, rollback_ns)
        result.rounds.append(record)
        if policy is not None:
            policy.record(record)
        if emitted and self.on_tokens is not None:
            self.on_tokens(emitted)
        if stop is not None:
            return self._end()
        appended = tuple(emitted) if block.tree is not None else ()
        self.pending, self.outcome = token, Outcome(accepted, token, appended)
        return True

    def context(self) -> list[int]:
        """The prompt and every token emitted so far: the target's cache holds all but the last."""
        return [*self.prompt, *self.result.tokens]

    def rebind(self, cache: list) -> None:
        """Keep the target's cache in ``cache`` from here (the context but its last token), rolled back
        alone: a generation leaving ``serve``'s batch."""
        model = self.decoder.target.model
        self.rollback = Rollback(model, cache, len(self.context()) - 1, self.decoder.rollback)

    def attach_source(self, source: DraftSource | None, k: int) -> None:
        """Draft with ``source``, started on this generation's context, from the next round."""
        self.source, self.k, self.outcome, self.closed = source, k, None, False
        self.policy = source if isinstance(source, Steering) else None

    def detach_source(self) -> None:
        """Close the draft source now: the rounds are drafted elsewhere from here (``serve``'s batch)."""
        self.close()
        self.source = self.policy = None

    def _end(self) -> bool:
        self.done = True
        self.result.end_ns = time.perf_counter_ns()
        self.result.transitions = list(getattr(self.policy, "switches", []))
        return False

    def close(self) -> None:
        """End the draft source's session (once), however the generation ended."""
        if not self.closed and self.source is not None:
            self.closed = True
            self.source.close()
