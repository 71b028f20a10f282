"""What a worker measures of its own speed at start, for coordinators to plan with.

* ``draft_speed``: greedy draft tokens per second, one token a pass, after a
  short warm-up (Hello's ``draft_tokens_per_second`` and the TXT record);
* ``pass_curve``: seconds of one tree pass (``specwire.drafting.ahead.draft_tree``) by the
  rows it expands side by side, the median of a few passes at each size
  (Hello's ``pass_curve``). A coordinator's drafting policy fits the
  machine's pass curve from it (``coordinator.planning.measured``).

Both run through the model the worker serves, so a paced worker measures the
machine it emulates. They run on the worker's compute thread, before it
serves.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from specwire.drafting.ahead.draft_tree import DraftTree, tree_batchable
from specwire.drafting.ahead.prespec_config import CURVE_ROWS, DEFAULT_FANOUT, PrespecConfig
from specwire.drafting.drafter import Drafter, LanguageModel
from specwire.drafting.sampling import SamplingParams
from specwire.emulation.profile import non_decreasing
from specwire.models.loading import LoadedModel

WARMUP_TEXT = "The quick brown fox jumps over the lazy dog."
PASSES_PER_SIZE = 2
CURVE_BUDGET_S = 2.0  # sizes after this much measuring are left out (a CPU's wide passes are slow)


def _prompt(model: LoadedModel) -> list[int]:
    return list(model.tokenizer.encode(WARMUP_TEXT)) if model.tokenizer is not None else [0, 1, 2, 3]


def draft_speed(model: LoadedModel, tokens: int) -> float:
    """Greedy draft tokens per second at batch 1, after a short warm-up."""
    prompt = _prompt(model)
    drafter = Drafter(model.model, SamplingParams())
    drafter.start(prompt)
    drafter.draft(2)
    drafter.apply(2, prompt[0])
    t0 = time.perf_counter()
    drafter.draft(tokens)
    return tokens / (time.perf_counter() - t0)


def pass_curve(model: LoadedModel, rows: Sequence[int] = CURVE_ROWS) -> list[tuple[int, float]]:
    """(rows, seconds) of a tree pass at each size in ``rows``, smallest first, until ``CURVE_BUDGET_S``
    is spent: the median of a few passes after one unmeasured pass (its kernels compiled). Empty for a
    model whose caches a tree cannot branch."""
    probe = Drafter(model.model, SamplingParams())
    probe.start(_prompt(model)[:2])
    if not tree_batchable(probe.cache):  # windowed layers: no tree (specwire.drafting.ahead.draft_tree)
        return []
    curve: list[tuple[int, float]] = []
    started = time.perf_counter()
    for n in rows:
        curve.append((n, _tree_pass_s(model.model, _prompt(model), n, model.context_length)))
        if time.perf_counter() - started > CURVE_BUDGET_S:
            break
    return non_decreasing(curve)


def _tree_pass_s(model: LanguageModel, prompt: list[int], rows: int, context_length: int) -> float:
    drafter = Drafter(model, SamplingParams())
    drafter.start(prompt)
    config = PrespecConfig(fanout=DEFAULT_FANOUT, batch=rows, fill=True, tree=True, budget=64)
    first = drafter.drafting(2, config.alternatives)
    first.advance()
    drafter.adopt(first)
    tree = DraftTree(drafter, config, context_length)
    tree.plant(first.tokens, first.candidates)
    while len(tree.table.unexpanded()) < rows and tree.step():  # until a pass can take all its rows
        pass
    tree.step()  # compiles this size's kernels
    samples = []
    for _ in range(PASSES_PER_SIZE):
        t0 = time.perf_counter()
        if not tree.step():
            break
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) if samples else float("nan")
