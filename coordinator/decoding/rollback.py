"""The target's cache after verification: keep what was accepted, whatever kind of layers it has.

Verification feeds [pending, d_1 .. d_k] in one pass; when only the first
a + 1 of those positions are accepted, the cache must hold exactly the
prompt and the accepted tokens again. KV layers are trimmed. A model with
recurrent layers (Gated DeltaNet, Mamba: ``specwire.rollback``) has its
state kept before the pass (references, no copy); after a rejection it is
put back and the accepted positions are fed again in a pass of their own
(``replay``), so the state is exactly what a plain pass over the accepted
prefix gives. ``replayed`` and ``replay_ns`` count what that cost.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from specwire.rollback import Checkpoints


class Rollback:
    """Rolls the target's cache back after each verification (module docstring)."""

    def __init__(self, model: Any, cache: list, position: int) -> None:
        self.model = model
        self.cache = cache
        self.checkpoints = Checkpoints(cache)
        self.position = position  # tokens the cache holds once the prompt is prefilled
        self.fed: list[int] = []
        self.replays = 0
        self.replayed = 0
        self.replay_ns = 0

    def before(self, fed: Sequence[int]) -> None:
        """A verification pass over ``fed`` is about to run."""
        self.fed = list(fed)
        self.checkpoints.forget_before(self.position)
        self.checkpoints.keep(self.position)

    def keep_first(self, count: int) -> None:
        """Keep the first ``count`` positions of the last pass; drop the rest."""
        after = self.position + len(self.fed)
        if count < len(self.fed) and self.checkpoints.exact:
            self.checkpoints.rewind(after, self.position + count)  # KV layers only: trim the rest
        elif count < len(self.fed):  # recurrent state: back to before the pass, then the accepted again
            started = time.perf_counter_ns()
            self.checkpoints.rewind(after, self.position)
            self.model(mx.array([self.fed[:count]]), cache=self.cache)
            mx.eval([c.state for c in self.cache])
            self.replays += 1
            self.replayed += count
            self.replay_ns += time.perf_counter_ns() - started
        self.position += count
