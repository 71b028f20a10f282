"""How well a draft model agrees with its target, on the built-in prompts at T = 0.

Two figures the performance model and pre-speculation live on: the mean
number of drafts accepted per round at k (the bench's "Mean acc": every
drafting round, averaged per prompt, then over prompts), and, along the
target's own greedy output, how often the target's next token is the draft's
first choice, within its two, its four and its eight most likely tokens
(pre-speculation guesses the target's verdicts from the draft's top choices).
``scripts/measure/pair_agreement.py`` prints them beside published figures.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.local import LocalDraftSource
from coordinator.prompts import BUILTIN_PROMPTS, encode_prompt
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel

TOPS = (1, 2, 4, 8)


def mean_accepted(target: LoadedModel, draft: LoadedModel, k: int, max_tokens: int) -> float:
    """Drafts accepted per drafting round, as the bench's row figure averages it."""
    decoder = SpeculativeDecoder(target, LocalDraftSource(draft))
    per_prompt = []
    for prompt in BUILTIN_PROMPTS:
        ids = encode_prompt(target, prompt.text, chat=True)
        per_prompt.append(
            decoder.generate(ids, max_tokens=max_tokens, k=k, params=SamplingParams()).mean_accepted
        )
    return float(np.mean(per_prompt))


def agreement(target: LoadedModel, draft: LoadedModel, max_tokens: int) -> dict[str, float]:
    """Top-1, top-2 and top-4 agreement with the target's next token, along its greedy output."""
    hits, total = np.zeros(len(TOPS)), 0
    for prompt in BUILTIN_PROMPTS:
        ids = encode_prompt(target, prompt.text, chat=True)
        out = SpeculativeDecoder(target).generate(ids, max_tokens=max_tokens, k=0, params=SamplingParams())
        sequence = ids + out.tokens
        logits = np.array(draft.model(mx.array([sequence[:-1]]))[0].astype(mx.float32))[len(ids) - 1 :]
        truth = np.array(sequence[len(ids) :])
        ranked = np.argsort(-logits, axis=-1)[:, : max(TOPS)]
        for i, top in enumerate(TOPS):
            hits[i] += (ranked[:, :top] == truth[:, None]).any(axis=-1).sum()
        total += len(truth)
    return {f"top{top}": float(hits[i] / total) for i, top in enumerate(TOPS)}
