"""Sampling parameters and the two distributions speculative decoding compares.

* The **target distribution** p is what the target alone would sample from:
  softmax(logits / T), truncated by the user's top-k, top-p and min-p (the
  logits first processed by the request's penalties and grammar:
  ``specwire.logits.processors``).
* The **draft distribution** q is the draft's softmax(logits / T), truncated
  further to ``draft_top_k`` tokens (and the same top-p and min-p). q is therefore
  exactly sparse: it travels as (ids, probs), and the verifier uses the very
  numbers the token was drawn from. Exact rejection sampling needs nothing
  else.

Both are computed in float64 with NumPy; each works on one logits row.
Temperature 0 never reaches these functions: it is greedy (argmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specwire.errors import InvalidArgumentError

DEFAULT_DRAFT_TOP_K = 32


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. ``temperature == 0`` means greedy decoding."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    draft_top_k: int = DEFAULT_DRAFT_TOP_K
    seed: int = 0
    min_p: float = 0.0  # keep tokens at least min_p times as probable as the most probable one

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0 and np.isfinite(self.temperature)):
            raise InvalidArgumentError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgumentError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidArgumentError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidArgumentError(f"min-p must be in [0, 1], got {self.min_p}")
        if self.draft_top_k < 1:
            raise InvalidArgumentError(f"draft top-k must be >= 1, got {self.draft_top_k}")

    @property
    def greedy(self) -> bool:
        """True at temperature 0."""
        return self.temperature == 0.0


@dataclass(frozen=True)
class SparseDistribution:
    """A distribution over a few token ids; ``probs`` sums to 1."""

    ids: np.ndarray
    probs: np.ndarray

    def prob(self, token: int) -> float:
        """Probability of ``token`` (0 when it is outside the support)."""
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def dense(self, size: int) -> np.ndarray:
        """The same distribution as a dense vector of ``size`` entries."""
        out = np.zeros(size, dtype=np.float64)
        out[self.ids] = self.probs
        return out


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / T) in float64."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    z -= z.max()
    e = np.exp(z)
    return e / e.sum()


def _keep_top(order: np.ndarray, probs: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """Ids to keep, most probable first: at most ``top_k``, then the prefix reaching ``top_p``, then those
    at least ``min_p`` times as probable as the first."""
    if top_k:
        order = order[:top_k]
    if top_p < 1.0:
        cumulative = np.cumsum(probs[order])
        order = order[: int(np.searchsorted(cumulative, top_p * cumulative[-1])) + 1]
    if min_p > 0.0:
        order = order[probs[order] >= min_p * probs[order[0]]]
    return order


def _descending(probs: np.ndarray, limit: int) -> np.ndarray:
    """Ids by probability, highest first, ties to the lower id; only the first ``limit`` matter."""
    if 0 < limit < probs.size:
        part = np.argpartition(-probs, limit - 1)[:limit]
        return part[np.lexsort((part, -probs[part]))]
    return np.lexsort((np.arange(probs.size), -probs))


def target_distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Dense p over the vocabulary: the target's own sampling distribution."""
    probs = softmax(logits, params.temperature)
    if params.top_k == 0 and params.top_p >= 1.0:
        if params.min_p == 0.0:
            return probs
        out = np.where(probs >= params.min_p * probs.max(), probs, 0.0)  # min-p alone: no ranking needed
        return out / out.sum()
    keep = _keep_top(_descending(probs, params.top_k), probs, params.top_k, params.top_p, params.min_p)
    out = np.zeros_like(probs)
    out[keep] = probs[keep]
    return out / out.sum()


def draft_distribution(logits: np.ndarray, params: SamplingParams) -> SparseDistribution:
    """Sparse q: the draft's distribution, truncated to ``draft_top_k`` and ``top_p``."""
    probs = softmax(logits, params.temperature)
    limit = min(params.draft_top_k, params.top_k) if params.top_k else params.draft_top_k
    keep = _keep_top(_descending(probs, limit), probs, limit, params.top_p, params.min_p)
    kept = probs[keep]
    return SparseDistribution(ids=keep.astype(np.int64), probs=kept / kept.sum())


def sample_sparse(dist: SparseDistribution, rng: np.random.Generator) -> int:
    """Draw one id from a sparse distribution."""
    return int(dist.ids[sample_dense(dist.probs, rng)])


def sample_dense(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one id from a dense distribution (inverse CDF; robust to rounding)."""
    cumulative = np.cumsum(probs)
    return int(min(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"), probs.size - 1))


def skip_draws(rng: np.random.Generator, drafts: int) -> None:
    """Advance a block's generator past ``drafts`` sampled drafts (``sample_dense`` takes one draw each)."""
    rng.random(drafts)


def choose_draft_token(
    logits: np.ndarray, params: SamplingParams, rng: np.random.Generator
) -> tuple[int, SparseDistribution | None]:
    """Pick a draft token from one logits row: argmax at T = 0, else a draw from sparse q."""
    if params.greedy:
        return int(np.argmax(logits)), None
    dist = draft_distribution(logits, params)
    return sample_sparse(dist, rng), dist
