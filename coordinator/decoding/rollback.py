"""The target's cache after verification: keep what was accepted, whatever kind of layers it has.

Verification feeds [pending, d_1 .. d_k] in one pass; when only the first
a + 1 of those positions are accepted, the cache must hold exactly the
prompt and the accepted tokens again. Three ways, by the model's layers:

* ``trim``: every layer is a KV cache; the rejected positions are trimmed.
* ``states`` (dense Qwen3.5): the verification pass keeps each Gated
  DeltaNet layer's state after every position
  (``coordinator.decoding.recurrent_pass``); after a rejection the state
  after the last accepted position is put back and the attention layers are
  trimmed. It costs memory for the states of the rejected positions, held
  until the verdict, and no extra pass.
* ``replay`` (any other recurrent model: Mamba, LFM2, ...): the recurrent
  state is kept before the pass (references, no copy, ``specwire.drafting.rollback``);
  after a rejection it is put back and the accepted positions are fed again
  in a pass of their own. It costs a target pass over a + 1 positions.

Either way the state is exactly what a plain pass over the accepted prefix
gives. A tree of drafts (``verify_tree``) is fed in one pass with tree
attention (``specwire.models.tree_pass``); ``keep_path`` then moves the
accepted path's K/V into place and drops the rest. Trees need every layer to
be a KV cache, or a dense Qwen3.5 model, whose tree pass keeps every node's
Gated DeltaNet state (``coordinator.decoding.recurrent_tree``) and puts the
accepted path's back. ``RollbackStats`` counts what rolling back cost.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from coordinator.decoding.recurrent_pass import LayerStates, forward_keeping_states, keeps_states
from coordinator.decoding.recurrent_tree import forward_tree_keeping_states
from specwire.drafting.drafter import prefill
from specwire.drafting.rollback import Checkpoints
from specwire.drafting.token_tree import TokenTree
from specwire.emulation.pace import hold_pass
from specwire.errors import InvalidArgumentError, UnsupportedModelError
from specwire.models.tree_pass import check_tree_support, forward_at, keep_positions

STRATEGIES = ("auto", "states", "replay")


@dataclass
class RollbackStats:
    """What rolling the target's cache back cost over one generation."""

    strategy: str
    rounds: int = 0  # rounds that rolled back (some drafts rejected)
    replayed: int = 0  # positions fed again (replay)
    rollback_ns: int = 0  # restoring states, trimming and replaying
    state_bytes: int = 0  # most bytes of per-position states held at once (states)


class Rollback:
    """Runs the target's verification pass and rolls its cache back after it (module docstring)."""

    def __init__(self, model: Any, cache: list, position: int, strategy: str = "auto") -> None:
        if strategy not in STRATEGIES:
            raise InvalidArgumentError(f"rollback {strategy!r}: expected one of {', '.join(STRATEGIES)}")
        self.model = model
        self.cache = cache
        self.checkpoints = Checkpoints(cache)
        if self.checkpoints.exact:
            strategy = "trim"  # nothing to choose: every layer trims
        elif strategy == "auto":
            strategy = "states" if keeps_states(model, cache) else "replay"
        elif strategy == "states" and not keeps_states(model, cache):
            raise UnsupportedModelError(
                "rollback 'states' keeps per-position states of dense Qwen3.5 models only; use 'replay'"
            )
        self.stats = RollbackStats(strategy)
        self.position = position  # tokens the cache holds once the prompt is prefilled
        self.fed: list[int] = []
        self.states: dict[int, LayerStates] = {}
        self._trees_checked = False

    @property
    def strategy(self) -> str:
        """``trim``, ``states`` or ``replay``."""
        return self.stats.strategy

    def verify(self, fed: Sequence[int]) -> mx.array:
        """The target's logits over ``fed`` (one pass, [1, positions, vocab]); the cache holds them all."""
        self.fed = list(fed)
        inputs = mx.array([self.fed])
        if self.strategy == "states" and len(self.fed) > 1:
            started = time.perf_counter()
            logits, self.states = forward_keeping_states(self.model, inputs, self.cache)
            hold_pass(self.model, started, len(self.fed), logits, self.cache, list(self.states.values()))
            earlier = [pair for layer in self.states.values() for pair in layer[:-1]]  # the last is the cache
            held = sum(conv.nbytes + state.nbytes for conv, state in earlier)
            self.stats.state_bytes = max(self.stats.state_bytes, held)
            return logits
        if self.strategy == "replay":
            self.checkpoints.forget_before(self.position)
            self.checkpoints.keep(self.position)
        return self.model(inputs, cache=self.cache)

    def verify_tree(self, pending: int, tree: TokenTree) -> mx.array:
        """The logits after ``pending`` and after each node of ``tree``: one pass, [1, n + 1, vocab]."""
        if not self._trees_checked:  # once a generation: the model and its cache do not change
            if self.strategy != "states":  # dense Qwen3.5 keeps every node's state (recurrent_tree)
                check_tree_support(self.model, self.cache)
            self._trees_checked = True
        rooted = tree.rooted(pending)
        self.fed = list(rooted.tokens)
        prefix = np.ones((len(rooted), self.position), dtype=bool)
        visible = np.concatenate([prefix, rooted.visible()], axis=1)
        positions = [self.position + depth - 1 for depth in rooted.depths]
        if self.strategy == "states":
            started = time.perf_counter()
            logits, self.states = forward_tree_keeping_states(
                self.model, self.cache, rooted.tokens, rooted.parents, positions, visible
            )
            hold_pass(self.model, started, len(rooted), logits, self.cache, list(self.states.values()))
            held = sum(conv.nbytes + state.nbytes for layer in self.states.values() for conv, state in layer)
            self.stats.state_bytes = max(self.stats.state_bytes, held)
            return logits
        return forward_at(self.model, self.cache, rooted.tokens, positions, visible)

    def keep_path(self, path: Sequence[int]) -> int:
        """After ``verify_tree``: keep ``pending`` and the tree's nodes ``path``; returns the ns it took."""
        started = time.perf_counter_ns()
        kept = [self.position, *(self.position + 1 + node for node in path)]
        if len(kept) < len(self.fed):
            self.stats.rounds += 1
        last = path[-1] + 1 if path else 0  # the rooted tree's index of the path's last token
        for i, layer in self.states.items():  # a recurrent layer: the state after the path's last token
            self.cache[i][0], self.cache[i][1] = layer[last]
        attention = [layer for i, layer in enumerate(self.cache) if i not in self.states]
        keep_positions(attention, self.position, kept)
        self.states = {}
        self.position += len(kept)
        spent = time.perf_counter_ns() - started
        self.stats.rollback_ns += spent
        return spent

    def keep_first(self, count: int) -> int:
        """Keep the first ``count`` positions of the last pass; drop the rest. Returns the ns it took."""
        drop = len(self.fed) - count
        started = time.perf_counter_ns()
        if drop > 0:
            self.stats.rounds += 1
            if self.strategy == "trim":
                self.checkpoints.rewind(self.position + len(self.fed), self.position + count)
            elif self.strategy == "states":
                self._restore(count, drop)
            else:  # back to before the pass, then the accepted positions again
                self.checkpoints.rewind(self.position + len(self.fed), self.position)
                self.model(mx.array([self.fed[:count]]), cache=self.cache)
                mx.eval([c.state for c in self.cache])
                self.stats.replayed += count
        self.states = {}
        self.position += count
        spent = time.perf_counter_ns() - started if drop > 0 else 0
        self.stats.rollback_ns += spent
        return spent

    def _restore(self, count: int, drop: int) -> None:
        for i, layer in enumerate(self.cache):
            if i in self.states:
                layer[0], layer[1] = self.states[i][count - 1]
            else:
                layer.trim(drop)


def warm_states(model: Any, k: int) -> float:
    """Run a dense Qwen3.5 model's state-keeping passes once (a chain of k + 1 positions, and a tree
    two levels deep), so their kernels are compiled before anything is timed; 0 for other models.
    Returns the seconds it took (``specwire.drafting.warmup``)."""
    cache = make_prompt_cache(model)
    if not keeps_states(model, cache):
        return 0.0
    started = time.perf_counter()
    prefill(model, cache, [0])
    rollback = Rollback(model, cache, 1, "states")
    mx.eval(rollback.verify([0] * (k + 1)))
    rollback.keep_first(1)
    tree = TokenTree((0, 1, 0, 1, 0), (-1, -1, 0, 0, 1))  # two nodes, then three under them
    mx.eval(rollback.verify_tree(0, tree))
    rollback.keep_path([0, 2])
    return time.perf_counter() - started
