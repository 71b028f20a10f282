"""At T > 0, speculative decoding samples exactly from the target's distribution.

Tiny random-weight models keep this fast (``sampling_pair``: one layer each;
2026-11-28, this VM, the file's CPU 127.6 s with two layers, 77.3 s with
one). The SD engine generates two tokens 400 times (one seed each); a chi-square
test compares the joint distribution of (t1, t2) with the target's exact
one, computed by enumerating its conditionals. The same test must fail when
the residual step samples from p instead of norm(max(0, p - q)): with the
200 runs it uses, it did so at p ~ 4e-7, and at 100 runs at 2e-4, under the
floor. Seeds are fixed, so each run is reproducible.

How many runs (measured 2026-11-29): every broken check below fails at
150 runs or fewer, where a sound check takes 400 (the hybrid tree 200). The
broken residual reads p = 2e-4 at 100 runs, the tree walk that takes the
likeliest child unchecked 4e-10 at 100 (a local tree) and 1e-4 at 150 (a
worker's cache), the hybrid tree's chained state 2e-159 at 100. At 800 runs
the checks cost twice as much and caught nothing these do not.

Two generations sampled together, a round each in turn, or decoded in one
batch (``serve``'s concurrent requests), are each distributed as the target
too.

Trees (local tree SD) are checked the same way: three tokens generated with
trees up to two deep, so that (t1, t2) is accepted down a path, from a
sibling, or drawn as a correction. The check must fail when the walk
accepts the tree's likeliest child without the target's draw. A worker's
speculation cache (its session run in-process, its entries verified as
trees, the rounds it has nothing for verified as a lone token or a local
tree) passes and fails the same checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

import coordinator.decoding.acceptance as acceptance
import coordinator.decoding.engine as engine
import coordinator.decoding.recurrent_tree as recurrent_tree
from coordinator.decoding.batch import DecodingBatch
from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.local import LocalDraftSource
from coordinator.drafting.local_tree import LocalTreeDraftSource, VerifyCurve
from coordinator.drafting.remote_tree import RemoteTreeDraftSource
from specwire.drafting.sampling import (
    SamplingParams,
    SparseDistribution,
    draft_distribution,
    target_distribution,
)
from specwire.logits.processors import Penalties, Processing
from specwire.models.loading import LoadedModel
from specwire.models.tiny_hybrid import build_tiny_hybrid
from specwire.v1 import draft_pb2 as pb
from tests.support.models.tiny_models import as_loaded, sampling_pair, tiny_llama
from tests.support.session_source import SessionSource

PROMPT = [2, 5, 1]
FREE = VerifyCurve((1, 64), (1.0, 1.0))  # positions cost nothing: the worker's whole entry is verified
P_VALUE_FLOOR = 0.001
RUNS = 400
TREE_RUNS = 400  # the broken walk fails at 100 (a local tree) and 150 (a worker's cache)
MIN_EXPECTED = 5.0


@pytest.fixture(scope="module")
def pair() -> tuple[LoadedModel, LoadedModel]:
    return sampling_pair()


def p_next_of(
    target: LoadedModel, params: SamplingParams, penalties: Penalties | None = None
) -> Callable[[list[int]], np.ndarray]:
    """The target's own next-token distribution after a context that begins with PROMPT."""

    def p_next(context: list[int]) -> np.ndarray:
        logits = np.array(target.model(mx.array([context]))[0, -1])
        if penalties is not None:
            logits = Processing(penalties, PROMPT).row(logits, context[len(PROMPT) :])
        return target_distribution(logits, params)

    return p_next


def exact_joint(
    target: LoadedModel, params: SamplingParams, penalties: Penalties | None = None
) -> np.ndarray:
    """P(t1, t2 | prompt) under the target's own sampling distribution (its logits processed by
    ``penalties``, if given)."""
    p_next = p_next_of(target, params, penalties)
    p1 = p_next(PROMPT)
    return np.stack([p1[a] * p_next([*PROMPT, a]) for a in range(p1.size)])


def exact_joint_after(
    target: LoadedModel, params: SamplingParams, skip: int, penalties: Penalties | None = None
) -> np.ndarray:
    """P(t[skip + 1], t[skip + 2] | prompt): the target's joint of two tokens after ``skip`` others,
    summed over those."""
    p_next = p_next_of(target, params, penalties)

    def joint(context: list[int], depth: int) -> np.ndarray:
        if depth == skip:
            p1 = p_next(context)
            return np.stack([p1[a] * p_next([*context, a]) for a in range(p1.size)])
        p = p_next(context)
        return sum(p[a] * joint([*context, a], depth + 1) for a in range(p.size) if p[a] > 0)

    return joint(list(PROMPT), 0)


def sd_joint_counts(
    pair: tuple[LoadedModel, LoadedModel],
    k: int,
    runs: int,
    tree: bool = False,
    worker: str = "",
    penalties: Penalties | None = None,
    **sampling: float,
) -> np.ndarray:
    """(t1, t2) counts over ``runs`` seeds: local SD, local tree SD (``tree``), or a worker's cache
    verified as trees (``worker``: the miss shape), the worker's session run in-process."""
    target, draft = pair
    source: Any = LocalTreeDraftSource(draft, None, nodes=6, width=3) if tree else LocalDraftSource(draft)
    skip = 0
    if worker:  # counted after two tokens: the first round's chain gives at most those
        prespec = pb.PreSpeculation(enabled=True, fill=True, tree=True, batch=3, fanout=3, budget=2)
        source = RemoteTreeDraftSource(SessionSource(draft, prespec, tree_nodes=6), draft, FREE, worker)
        skip = 2
    decoder = SpeculativeDecoder(target, source)
    vocab = target.vocab_size
    counts = np.zeros((vocab, vocab))
    tokens = skip + (3 if tree else 2)
    for seed in range(runs):
        params = SamplingParams(seed=seed, **sampling)  # type: ignore[arg-type]
        processing = Processing(penalties, PROMPT) if penalties is not None else None
        result = decoder.generate(PROMPT, max_tokens=tokens, k=k, params=params, processing=processing)
        counts[result.tokens[skip], result.tokens[skip + 1]] += 1
    return counts


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit, pooling cells expected fewer than MIN_EXPECTED times into one."""
    observed, expected = counts.ravel(), probs.ravel() * counts.sum()
    big = expected >= MIN_EXPECTED
    obs, exp = observed[big], expected[big]
    pooled_obs, pooled_exp = observed[~big].sum(), expected[~big].sum()
    if pooled_exp > 0:
        obs, exp = np.append(obs, pooled_obs), np.append(exp, pooled_exp)
    elif pooled_obs > 0:
        return 0.0  # outcomes the target gives probability zero
    return float(chisquare(obs, exp).pvalue)


@pytest.mark.parametrize(
    ("k", "sampling"),
    [
        (2, {"temperature": 1.0, "draft_top_k": 4}),
        (1, {"temperature": 0.7, "top_p": 0.9, "draft_top_k": 3}),
    ],
)
def test_sd_output_is_distributed_as_target(
    pair: tuple[LoadedModel, LoadedModel], k: int, sampling: dict
) -> None:
    counts = sd_joint_counts(pair, k, RUNS, **sampling)
    assert chi_square_p(counts, exact_joint(pair[0], SamplingParams(**sampling))) >= P_VALUE_FLOOR


def test_two_generations_sampled_together_are_each_distributed_as_target(
    pair: tuple[LoadedModel, LoadedModel],
) -> None:
    # As serve runs them: two generations, each with its own draft source and seed, a round each in turn.
    target, draft = pair
    sampling = {"temperature": 1.0, "draft_top_k": 4}
    counts = np.zeros((target.vocab_size, target.vocab_size))
    for seed in range(0, RUNS, 2):  # RUNS outputs
        together = [
            SpeculativeDecoder(target, LocalDraftSource(draft)).begin(
                PROMPT,
                max_tokens=2,
                k=2,
                params=SamplingParams(seed=seed + i, **sampling),  # type: ignore[arg-type]
            )
            for i in range(2)
        ]
        while any([d.round() for d in together]):  # every generation takes its round, each time
            pass
        for decoding in together:
            decoding.close()
            counts[decoding.result.tokens[0], decoding.result.tokens[1]] += 1
    assert chi_square_p(counts, exact_joint(target, SamplingParams(**sampling))) >= P_VALUE_FLOOR  # type: ignore[arg-type]


def test_generations_decoded_in_one_batch_are_each_distributed_as_target(
    pair: tuple[LoadedModel, LoadedModel],
) -> None:
    # As serve runs concurrent requests: one draft pass and one verification pass for both rows.
    target, draft = pair
    sampling = {"temperature": 0.7, "top_p": 0.9, "draft_top_k": 4}
    counts = np.zeros((target.vocab_size, target.vocab_size))
    decoder = SpeculativeDecoder(target)
    for seed in range(0, RUNS, 2):  # RUNS outputs
        batch = DecodingBatch(target, draft)
        together = [
            decoder.begin(PROMPT, max_tokens=2, k=0, params=SamplingParams(seed=seed + i, **sampling))  # type: ignore[arg-type]
            for i in range(2)
        ]
        for decoding in together:
            batch.join(decoding, 2)
        while batch.rows:
            batch.round()
        for decoding in together:
            counts[decoding.result.tokens[0], decoding.result.tokens[1]] += 1
    assert chi_square_p(counts, exact_joint(target, SamplingParams(**sampling))) >= P_VALUE_FLOOR  # type: ignore[arg-type]


def test_check_fails_when_residual_is_replaced_by_p(
    pair: tuple[LoadedModel, LoadedModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    sampling = {"temperature": 1.0, "draft_top_k": 4}
    monkeypatch.setattr(acceptance, "residual_distribution", lambda p, q: p)
    counts = sd_joint_counts(pair, 2, RUNS // 2, **sampling)
    assert chi_square_p(counts, exact_joint(pair[0], SamplingParams(**sampling))) < P_VALUE_FLOOR


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0.7}, {"temperature": 1.0, "top_p": 0.9}], ids=["t0.7", "t1-top-p"]
)
def test_tree_sd_output_is_distributed_as_target(
    pair: tuple[LoadedModel, LoadedModel], sampling: dict
) -> None:
    counts = sd_joint_counts(pair, 2, TREE_RUNS, tree=True, **sampling)
    assert chi_square_p(counts, exact_joint(pair[0], SamplingParams(**sampling))) >= P_VALUE_FLOOR


@pytest.fixture(scope="module")
def hybrid_target_pair() -> tuple[LoadedModel, LoadedModel]:
    """A target in Qwen3.5's layout (three Gated DeltaNet layers to one full attention, so a wrong
    recurrent state shows in its distribution) and a llama draft over the same 8 tokens."""
    target, args = build_tiny_hybrid(8, layers=4)
    draft, draft_args = tiny_llama(1)
    return as_loaded(target, args, "hybrid-target"), as_loaded(draft, draft_args, "tiny-draft")


def test_tree_sd_with_a_hybrid_target_is_distributed_as_target(
    hybrid_target_pair: tuple[LoadedModel, LoadedModel],
) -> None:
    # Every node's Gated DeltaNet state is its own path's; half the runs of the llama pair's test.
    counts = sd_joint_counts(hybrid_target_pair, 2, TREE_RUNS // 2, tree=True, temperature=0.7)
    expected = exact_joint(hybrid_target_pair[0], SamplingParams(temperature=0.7))
    assert chi_square_p(counts, expected) >= P_VALUE_FLOOR


def test_hybrid_tree_check_fails_when_each_node_continues_the_previous_tokens_state(
    hybrid_target_pair: tuple[LoadedModel, LoadedModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    chained = recurrent_tree._gated_delta_tree

    def sequential(module, x, parents, cache, starts=None):  # type: ignore[no-untyped-def]
        return chained(module, x, [t - 1 for t in range(len(parents))], cache, starts)

    monkeypatch.setattr(recurrent_tree, "_gated_delta_tree", sequential)
    counts = sd_joint_counts(hybrid_target_pair, 2, TREE_RUNS // 4, tree=True, temperature=0.7)
    expected = exact_joint(hybrid_target_pair[0], SamplingParams(temperature=0.7))
    assert chi_square_p(counts, expected) < P_VALUE_FLOOR


@pytest.mark.parametrize(
    ("sampling", "miss"),
    [({"temperature": 0.7}, "ar"), ({"temperature": 1.0, "top_p": 0.9}, "tree")],
    ids=["t0.7", "t1-top-p"],
)
def test_a_workers_cache_verified_as_trees_is_distributed_as_target(
    pair: tuple[LoadedModel, LoadedModel], sampling: dict, miss: str
) -> None:
    """Through the worker's entries (hits), the first round's sampled chain, and rounds it had nothing
    for (misses: a lone token, or a local tree)."""
    counts = sd_joint_counts(pair, 1, TREE_RUNS, worker=miss, **sampling)
    assert chi_square_p(counts, exact_joint_after(pair[0], SamplingParams(**sampling), 2)) >= P_VALUE_FLOOR


def test_tree_check_fails_when_the_walk_takes_the_likeliest_child_unchecked(
    pair: tuple[LoadedModel, LoadedModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unchecked(logits, tree, params, rng):  # type: ignore[no-untyped-def]
        path, node = [], -1
        while (child := next((i for i, p in enumerate(tree.parents) if p == node), None)) is not None:
            path.append(child)
            node = child
        return path, acceptance.sample_dense(acceptance.target_distribution(logits[node + 1], params), rng)

    monkeypatch.setattr(engine, "accept_tree_sampled", unchecked)
    sampling = {"temperature": 0.7}
    counts = sd_joint_counts(pair, 2, RUNS // 2, tree=True, **sampling)
    assert chi_square_p(counts, exact_joint(pair[0], SamplingParams(**sampling))) < P_VALUE_FLOOR
    counts = sd_joint_counts(pair, 1, RUNS // 2, worker="ar", **sampling)  # the worker's cache as well
    assert chi_square_p(counts, exact_joint_after(pair[0], SamplingParams(**sampling), 2)) < P_VALUE_FLOOR


def _first_token_counts(p: np.ndarray, q: SparseDistribution, runs: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    logits = np.log(np.stack([p, p]))
    params = SamplingParams(temperature=1.0, draft_top_k=p.size)
    counts = np.zeros(p.size)
    for _ in range(runs):
        draft = int(rng.choice(q.ids, p=q.probs))
        n, token = acceptance.accept_sampled(logits, [draft], [q], params, rng)
        counts[draft if n == 1 else token] += 1
    return counts


def test_single_rejection_step_reproduces_p_exactly() -> None:
    p = np.array([0.5, 0.2, 0.2, 0.1])
    q = draft_distribution(
        np.log(np.array([0.1, 0.6, 0.2, 0.1])), SamplingParams(temperature=1.0, draft_top_k=3)
    )
    assert chi_square_p(_first_token_counts(p, q, 40000), p) >= P_VALUE_FLOOR
