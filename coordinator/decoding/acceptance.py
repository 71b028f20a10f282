"""Deciding how many drafts the target accepts, and which token it adds.

* Greedy (T = 0): accept while the target's argmax equals the draft; the
  target's argmax at the first mismatch (or after the last draft) is the
  correction or bonus token. The output is exactly the target's greedy output.
* Sampling (T > 0): exact rejection sampling (Leviathan et al. 2023; Chen et
  al. 2023). Draft d_i, drawn from q_i, is accepted with probability
  min(1, p_i(d_i) / q_i(d_i)); the first rejection is replaced by a draw from
  norm(max(0, p_i - q_i)); if all k are accepted, a bonus token is drawn from
  p_{k+1}. Every emitted token is then distributed exactly as the target's.
* A tree of drafts (``specwire.drafting.token_tree``): the target's token
  after the verified prefix names the child to follow, if one holds it, and
  so on down; the last token is the correction or, after a leaf, the bonus.
  At T = 0 the token is the argmax; at T > 0 a draw from the target's
  distribution, so every token is the target's own draw whatever the tree
  holds (lossless for any tree fixed before the draws, top-choice trees
  included).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specwire.drafting.sampling import SamplingParams, SparseDistribution, sample_dense, target_distribution
from specwire.drafting.token_tree import TokenTree


def accept_greedy(target_choices: Sequence[int], drafts: Sequence[int]) -> tuple[int, int]:
    """``target_choices`` holds the target's argmax at each of the k + 1 positions."""
    n = 0
    while n < len(drafts) and target_choices[n] == drafts[n]:
        n += 1
    return n, int(target_choices[n])


def residual_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)); p itself in the measure-zero case where nothing is left."""
    residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    return residual / total if total > 0 else p


def accept_sampled(
    target_logits: np.ndarray | Sequence[np.ndarray],
    drafts: Sequence[int],
    dists: Sequence[SparseDistribution],
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Rejection-sample k drafts against the target's k + 1 logits rows."""
    for i, (token, q) in enumerate(zip(drafts, dists, strict=True)):
        p = target_distribution(target_logits[i], params)
        q_token = q.prob(token)
        if q_token <= 0.0:  # cannot happen for a token drawn from q; reject it outright
            return i, sample_dense(p, rng)
        # A target that speaks fewer ids than its draft (an emulation model: specwire.models.tiny) gives
        # every later id probability 0: such a draft is rejected, and its mass there leaves no residual.
        if rng.random() * q_token < (p[token] if token < p.size else 0.0):
            continue
        inside = q.ids < p.size
        q_dense = np.zeros(p.size)
        q_dense[q.ids[inside]] = q.probs[inside]
        return i, sample_dense(residual_distribution(p, q_dense), rng)
    p_bonus = target_distribution(target_logits[len(drafts)], params)
    return len(drafts), sample_dense(p_bonus, rng)


def accept_tree_greedy(target_choices: Sequence[int], tree: TokenTree) -> tuple[list[int], int]:
    """The path of nodes the target agrees with, and its token after the path's last node.

    ``target_choices`` holds the target's argmax at the last verified token
    (row 0) and after each node (row i + 1).
    """
    path: list[int] = []
    node = -1
    while (child := tree.child(node, int(target_choices[node + 1]))) is not None:
        path.append(child)
        node = child
    return path, int(target_choices[node + 1])


def accept_tree_sampled(
    target_logits: np.ndarray | Sequence[np.ndarray],
    tree: TokenTree,
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[list[int], int]:
    """Walk the tree with the target's own samples: draw its token after the path, follow the child
    holding it, stop where no child does.

    Every token is a draw from the target's distribution after the tokens
    before it, and the tree was drafted before any draw, so the output is
    distributed exactly as the target's, whatever the tree holds.
    """
    path: list[int] = []
    node = -1
    while True:
        token = sample_dense(target_distribution(target_logits[node + 1], params), rng)
        child = tree.child(node, token)
        if child is None:
            return path, token
        path.append(child)
        node = child
