"""A request's logit bias and penalties (``specwire.logits.processors``) under speculative decoding.

The penalties are mlx-lm's own (checked against its processors). Every
verified position is processed with the history it follows, so at T = 0
speculative decoding under penalties emits exactly what the target alone
emits under them, in local SD, local tree SD, a worker's trees (its session
run in-process) and serve's batch; at T > 0 its output is distributed as
the processed target's (chi-square, as in ``test_rejection_sampling``) in
local SD and local tree SD (a worker's trees are verified as a local tree's
are).
The checks fail when verification ignores the processing (at the same 400
runs each check takes).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import make_logits_processors

from coordinator.decoding.batch import DecodingBatch
from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.local import LocalDraftSource
from coordinator.drafting.local_tree import LocalTreeDraftSource
from coordinator.drafting.remote_tree import RemoteTreeDraftSource
from specwire.drafting.choices import likeliest, processed_choices
from specwire.drafting.sampling import SamplingParams
from specwire.logits.processors import PENALTY_CONTEXT, Penalties, Processing
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from tests.coordinator.decoding.test_rejection_sampling import (
    FREE,
    P_VALUE_FLOOR,
    PROMPT,
    RUNS,
    chi_square_p,
    exact_joint,
    sd_joint_counts,
)
from tests.support.models.tiny_models import sampling_pair
from tests.support.session_source import SessionSource

PENALTIES = Penalties(
    logit_bias=((3, 1.5), (6, -2.0)), repetition_penalty=1.6, presence_penalty=0.4, frequency_penalty=0.3
)
SAMPLING = {"temperature": 1.0, "top_k": 6, "min_p": 0.02, "draft_top_k": 4}


@pytest.fixture(scope="module")
def pair() -> tuple[LoadedModel, LoadedModel]:
    return sampling_pair()


def test_penalties_are_mlx_lms() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, 64).astype(np.float32)
    history = rng.integers(0, 64, 40).tolist()  # longer than the penalties' window, with repeats
    suffix = [5, 5, 9]
    theirs = make_logits_processors(
        logit_bias=dict(PENALTIES.logit_bias),
        repetition_penalty=PENALTIES.repetition_penalty,
        presence_penalty=PENALTIES.presence_penalty,
        frequency_penalty=PENALTIES.frequency_penalty,
    )
    expected = mx.array(logits)[None]
    for processor in theirs:
        expected = processor(mx.array([*history, *suffix]), expected)
    ours = Processing(PENALTIES, history).row(logits, suffix)
    np.testing.assert_allclose(ours, np.array(expected[0]), rtol=1e-5, atol=1e-5)
    assert not np.allclose(ours, logits)  # the penalties changed something
    later = Processing(PENALTIES, history)
    later.accept(suffix)  # accepting the suffix is the same as reading it
    np.testing.assert_array_equal(later.row(logits, ()), ours)
    assert PENALTY_CONTEXT == 20  # mlx-lm's default window


def test_tree_rows_are_penalised_where_the_logits_are_as_on_the_host() -> None:
    # A draft tree's rows (a worker's or a local tree's) are processed on the device: only the ids the
    # bias and penalties name move, each as ``row`` moves it, and the nodes chosen are the host's.
    rng = np.random.default_rng(1)
    vocab = 4096
    logits = rng.normal(0, 3, (5, vocab)).astype(np.float32)
    history = rng.integers(0, 64, 40).tolist()
    suffixes = [[], [5], [5, 5, 9], [3, 6, 3], [4095, 7]]
    processing = Processing(PENALTIES, history)
    on_device = np.array(processing.penalised(mx.array(logits), suffixes))
    on_host = np.stack([processing.row(row, suffix) for row, suffix in zip(logits, suffixes, strict=True)])
    np.testing.assert_allclose(on_device, on_host, rtol=1e-6, atol=1e-6)
    assert not np.allclose(on_device, logits)
    ids, _ = processed_choices(mx.array(logits), suffixes, processing, 6)
    assert ids == [c.ids.tolist() for c in likeliest(on_host, 6)]
    rows = mx.array(logits)
    assert Processing(Penalties(), history).penalised(rows, suffixes) is rows  # nothing to apply


def _source(kind: str, draft: LoadedModel) -> Any:
    if kind == "local":
        return LocalDraftSource(draft)
    if kind == "local-tree":
        return LocalTreeDraftSource(draft, None, nodes=6, width=3)
    prespec = pb.PreSpeculation(enabled=True, fill=True, tree=True, batch=3, fanout=3, budget=2)
    return RemoteTreeDraftSource(SessionSource(draft, prespec, tree_nodes=6), draft, FREE, "ar")


def _generate(target: LoadedModel, source: Any, k: int, penalties: Penalties | None) -> list[int]:
    processing = Processing(penalties, PROMPT) if penalties else None
    decoder = SpeculativeDecoder(target, source)
    return decoder.generate(PROMPT, max_tokens=24, k=k, params=SamplingParams(), processing=processing).tokens


@pytest.mark.parametrize("kind", ["local", "local-tree", "worker-tree"])
def test_greedy_sd_under_penalties_equals_the_target_alone_under_them(
    pair: tuple[LoadedModel, LoadedModel], kind: str
) -> None:
    target, draft = pair
    alone = _generate(target, None, 0, PENALTIES)
    assert alone != _generate(target, None, 0, None)  # the penalties change the output
    assert _generate(target, _source(kind, draft), 3, PENALTIES) == alone


def test_greedy_rows_of_a_batch_under_penalties_equal_each_alone(
    pair: tuple[LoadedModel, LoadedModel],
) -> None:
    target, draft = pair
    batch, decoder = DecodingBatch(target, draft), SpeculativeDecoder(target)
    asked = [PENALTIES, None, Penalties(repetition_penalty=3.0)]
    together = []
    for penalties in asked:
        processing = Processing(penalties, PROMPT) if penalties else None
        decoding = decoder.begin(PROMPT, max_tokens=24, k=0, params=SamplingParams(), processing=processing)
        batch.join(decoding, 2)
        together.append(decoding)
    while batch.rows:
        batch.round()
    assert [d.result.tokens for d in together] == [_generate(target, None, 0, p) for p in asked]


@pytest.mark.parametrize("kind", ["local", "local-tree"])  # a worker's trees verify as a local tree's do
def test_sampled_sd_under_penalties_is_distributed_as_the_processed_target(
    pair: tuple[LoadedModel, LoadedModel], kind: str
) -> None:
    params = SamplingParams(**SAMPLING)  # type: ignore[arg-type]
    tree = kind == "local-tree"
    counts = sd_joint_counts(pair, 2, RUNS, tree=tree, penalties=PENALTIES, **SAMPLING)
    assert chi_square_p(counts, exact_joint(pair[0], params, PENALTIES)) >= P_VALUE_FLOOR


def test_the_check_fails_when_verification_ignores_the_penalties(
    pair: tuple[LoadedModel, LoadedModel],
) -> None:
    counts = sd_joint_counts(pair, 2, RUNS, **SAMPLING)
    expected = exact_joint(pair[0], SamplingParams(**SAMPLING), PENALTIES)  # type: ignore[arg-type]
    assert chi_square_p(counts, expected) < P_VALUE_FLOOR
