"""This set-up, measured: the coordinator's pass curves, the pair's agreement and the workers' speeds,
as the hardware profile the performance model takes (``specwire.emulation.profile``).

At warm-up the coordinator measures, on its compute thread:

* the target's verification curve: one pass over each of ``VERIFY_SIZES``
  positions after a short prefill, fitted as ``verify_1 + (n - 1) *
  per_position`` (flat on Metal; about n passes for n positions on a CPU);
* its local draft model's pass (one position);
* the pair's agreement, from one target pass and one draft pass over a
  calibration text: how often the target's greedy token is the draft's first,
  within its two and within its four likeliest choices, and, at a
  temperature T, the expected acceptance of speculative sampling,
  E[sum_x min(p_T(x), q_T(x))] (the chance a sampled draft is kept).

Each worker advertises its pass curve (Hello's ``pass_curve``, measured at
its start; a paced worker measures the machine it emulates), and its link is
measured with gRPC echoes on a stream (``coordinator.workers.speed``).
Everything is measured the same way on a paced coordinator, whose passes
take the emulated machine's time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from coordinator.decoding.recurrent_pass import keeps_states
from coordinator.planning.model import Acceptance
from specwire.drafting.drafter import LanguageModel, prefill
from specwire.drafting.sampling import SamplingParams, draft_distribution, target_distribution
from specwire.drafting.warmup import WARM_CONTEXT, warm_drafter, warm_target
from specwire.emulation.profile import SAME_COST, Machine, PassCurve, Profile
from specwire.errors import UnsupportedModelError
from specwire.models.loading import LoadedModel
from specwire.models.tree_pass import check_tree_support

VERIFY_SIZES = (1, 2, 3, 5, 9)
FAST_PASS_S, FAST_SAMPLES = 0.05, 5  # passes this quick are timed this many times (the fastest counts)
CALIBRATION_TEXT = (
    "The lighthouse keeper climbed the stairs as the storm rolled in. "
    "def is_prime(n):\n    if n < 2:\n        return False\n    for i in range(2, int(n ** 0.5) + 1):\n"
    "        if n % i == 0:\n            return False\n    return True\n"
    "To multiply 17 by 23, write 23 as 20 + 3: 17 * 20 = 340 and 17 * 3 = 51, so the answer is 391."
)
CALIBRATION_BUDGET_S = 2.0  # the pair's agreement is measured over as much text as this buys
CALIBRATION_MIN_TOKENS = 16
# specwire's own cost per round beyond gRPC's echo (docs/protocol.md, "One round, part by part")
PROTOCOL_OWN_S = 0.5e-3
THIS_MACHINE = "this machine"


def fit_curve(points: Sequence[tuple[int, float]]) -> PassCurve:
    """The pass curve through (positions or rows, seconds): a line, or flat and then rising, whichever
    fits the points better (the smaller sum of squared log errors; the line on a tie).

    * The line: the one-position time (the fastest measured there, else the least-squares intercept),
      and the least-squares slope per further position through it (never below zero). Anchoring at
      the measured time keeps one slow pass over many positions from moving the one-position time,
      which AR's prediction is. A CPU's passes cost every position: a line.
    * Flat, then rising: a Mac's pass reads the weights whatever its positions until their compute
      takes longer (``PassCurve``'s decode time, then its prefill rate). The flat part is the one-
      position time; the rate is the median of positions over seconds of the points above it by more
      than ``SAME_COST``. A line through such points slopes from the first position: the paced M1
      Max's 16-row pass (11.5 ms, as one row) read 14.0 ms on the line through its 64-row pass.
    """
    if not points:
        raise ValueError("no pass times to fit")
    n = np.array([p[0] for p in points], dtype=np.float64)
    t = np.array([p[1] for p in points], dtype=np.float64)
    if len(points) == 1 or np.ptp(n) == 0:
        return PassCurve(1 / float(t.min()))
    line = _line(n - 1, t)
    one = 1 / line.decode_tok_s
    rising = t > one * SAME_COST
    if not rising.any():
        return line
    roofline = PassCurve(1 / one, float(np.median(n[rising] / t[rising])))

    def log_error(curve: PassCurve) -> float:
        fitted = np.array([curve.pass_s(int(m)) for m in n])
        return float(np.sum(np.log(fitted / t) ** 2))

    return roofline if log_error(roofline) < log_error(line) else line


def _line(n: np.ndarray, t: np.ndarray) -> PassCurve:
    """``fit_curve``'s line through (positions after the first, seconds)."""
    if (n == 0).any():
        one = float(t[n == 0].min())
    else:
        _, intercept = np.polyfit(n, t, 1)
        one = float(intercept) if intercept > 0 else float(t[np.argmin(n)])
    slope = float(np.sum(n * (t - one)) / np.sum(n * n))
    return PassCurve(1 / one, None, max(0.0, slope))


def pass_times(model: LanguageModel, sizes: Sequence[int] = VERIFY_SIZES) -> list[tuple[int, float]]:
    """(positions, seconds) of one pass over each of ``sizes`` after a short context (trimmed back after
    each): the fastest of ``FAST_SAMPLES`` where a pass takes under ``FAST_PASS_S`` (a GPU's, whose
    times jump between runs), else of two at one position and one elsewhere. Compute thread."""
    cache = make_prompt_cache(model)  # type: ignore[arg-type]
    prefill(model, cache, WARM_CONTEXT)

    def timed(positions: int) -> float:
        t0 = time.perf_counter()
        mx.eval(model(mx.array([[0] * positions]), cache=cache))
        seconds = time.perf_counter() - t0
        trim_prompt_cache(cache, positions)
        return seconds

    out = []
    for positions in sizes:
        samples = [timed(positions)]
        wanted = FAST_SAMPLES if samples[0] < FAST_PASS_S else 1 + (positions == 1)
        samples += [timed(positions) for _ in range(wanted - 1)]
        out.append((positions, min(samples)))
    return out


@dataclass(frozen=True)
class Agreement:
    """The pair's agreement on a calibration text (module docstring): greedy top-1/2/4, and the logits to
    compute the sampled acceptance at any temperature."""

    top1: float
    top2: float
    top4: float
    target_logits: np.ndarray = field(repr=False)
    draft_logits: np.ndarray = field(repr=False)
    top8: float | None = None  # a worker's verified tree keeps eight choices a node

    def greedy(self) -> dict[str, float]:
        """The profile's ``agreement`` at T = 0."""
        out = {"top1": self.top1, "top2": self.top2, "top4": self.top4}
        return out if self.top8 is None else {**out, "top8": self.top8}

    def at(self, temperature: float) -> tuple[float, dict[str, float]]:
        """Per-draft acceptance and agreement at ``temperature`` (0: greedy), with the draft's
        distribution truncated as the sampler truncates it (``SamplingParams.draft_top_k``)."""
        if temperature <= 0:
            return self.top1, self.greedy()
        params = SamplingParams(temperature=temperature)
        accepted: list[float] = []
        within: dict[int, list[float]] = {1: [], 2: [], 4: [], 8: []}
        for t_row, d_row in zip(self.target_logits, self.draft_logits, strict=True):
            p, q = target_distribution(t_row, params), draft_distribution(d_row, params)
            if p.size < d_row.size:  # a target speaking fewer ids than its draft: the rest have p = 0
                p = np.pad(p, (0, d_row.size - p.size))
            accepted.append(float(np.minimum(p[q.ids], q.probs).sum()))
            for j in within:
                within[j].append(float(p[q.ids[:j]].sum()))
        alpha = statistics.fmean(accepted)
        return alpha, {f"top{j}": statistics.fmean(v) for j, v in within.items()}


def agreement(
    target: LoadedModel, draft: LoadedModel, text: str = CALIBRATION_TEXT, most_tokens: int | None = None
) -> Agreement:
    """One pass of each model over ``text`` (its first ``most_tokens`` tokens): how the pair agrees
    (compute thread)."""
    if target.tokenizer is not None:
        tokens = list(target.tokenizer.encode(text))[:most_tokens]
    else:  # a tokenizer-less test model: a fixed walk through its vocabulary
        tokens = [(7 * i + 3) % target.vocab_size for i in range(most_tokens or CALIBRATION_MIN_TOKENS)]
    rows = []
    for model in (target.model, draft.model):
        cache = make_prompt_cache(model)
        logits = model(mx.array([tokens]), cache=cache)[0].astype(mx.float32)
        rows.append(np.array(logits))
    t_rows, d_rows = rows
    greedy = t_rows.argmax(axis=-1)
    ranked = np.argsort(-d_rows, axis=-1)[:, :8]
    top1, top2, top4, top8 = (
        float(np.mean([g in r[:j] for g, r in zip(greedy, ranked, strict=True)])) for j in (1, 2, 4, 8)
    )
    return Agreement(top1, top2, top4, t_rows, d_rows, top8)


@dataclass(frozen=True)
class WorkerSpeed:
    """A worker as the model takes it: its pass curve (rows side by side), its link, and what it can do."""

    name: str
    label: str
    address: str
    curve: PassCurve
    link_rtt_s: float
    tree: bool  # its model can draft a tree (plain KV caches)
    model: str  # the draft model it serves (its spec)
    colocated: bool = False  # on this machine, sharing its processors: its drafting overlaps nothing

    @property
    def title(self) -> str:
        """How set-ups name it: its label, else its name."""
        return self.label or self.name


def titled(workers: Sequence[WorkerSpeed]) -> list[WorkerSpeed]:
    """``workers`` with titles that tell them apart: labels, unless two share one (then names)."""
    labels = [w.label for w in workers]
    return [w if w.label and labels.count(w.label) == 1 else replace(w, label="") for w in workers]


def measure_here(target: LoadedModel, local: LoadedModel | None) -> MeasuredSetup:
    """This machine: the target's verification curve, the local draft's pass and the pair's agreement
    (no workers yet). Warms the shapes it times first. Compute thread."""
    warm_target(target.model, max(VERIFY_SIZES) - 1)
    verify = fit_curve(pass_times(target.model))
    if local is None:
        return MeasuredSetup(verify, None, None)
    warm_drafter(local.model)
    draft = fit_curve(pass_times(local.model, (1,)))
    per_token_s = verify.per_position_s + 1 / verify.decode_tok_s / 8 + draft.per_position_s
    length = max(CALIBRATION_MIN_TOKENS, int(CALIBRATION_BUDGET_S / max(per_token_s, 1e-9)))
    pair = agreement(target, local, most_tokens=length)
    return MeasuredSetup(verify, draft, pair, trees=_trees(target, local))


def _trees(target: LoadedModel, draft: LoadedModel) -> bool:
    """Whether the target can verify a tree and the draft draft one here: plain KV caches, or dense
    Qwen3.5, whose tree passes keep every node's state (``coordinator.decoding.recurrent_tree``)."""
    for model in (target, draft):
        cache = make_prompt_cache(model.model)
        if keeps_states(model.model, cache):
            continue
        try:
            check_tree_support(model.model, cache)
        except UnsupportedModelError:
            return False
    return True


@dataclass(frozen=True)
class MeasuredSetup:
    """This machine's target and local draft curves, the pair's agreement, and the workers' speeds."""

    target: PassCurve
    local_draft: PassCurve | None
    agreement: Agreement | None
    workers: tuple[WorkerSpeed, ...] = ()
    trees: bool = False  # the target verifies trees and the local draft drafts them (measured._trees)

    def alpha(self, temperature: float) -> float:
        """The pair's per-draft acceptance at ``temperature`` (a prior of 0.7 without a calibration)."""
        return self.agreement.at(temperature)[0] if self.agreement is not None else 0.7

    def profile(self, temperature: float, alpha: float | None = None, k: int = 4) -> Profile:
        """The profile of this set-up at ``temperature``: every worker a machine named by its title; the
        link is the slowest worker's (``profile_for`` gives each its own)."""
        a = self.alpha(temperature) if alpha is None else alpha
        agreement = self.agreement.at(temperature)[1] if self.agreement is not None else {}
        if agreement:  # at T > 0 a tree is verified by the target's draws: their first-choice share too
            draw1 = {"draw1": agreement["top1"]} if temperature > 0 else {}
            agreement = {**agreement, "top1": a, **draw1}
        rtt = max((w.link_rtt_s for w in self.workers), default=0.0)
        return Profile(
            name="measured",
            target_machine=Machine(THIS_MACHINE, self.local_draft, self.target),
            workers=tuple(Machine(w.title, w.curve) for w in self.workers),
            mean_accepted=Acceptance((a,)).expected_accepted(k),
            k=k,
            link_rtt_s=rtt,
            stream_per_round_s=PROTOCOL_OWN_S,
            agreement=agreement,
        )

    def profile_for(self, worker: WorkerSpeed, base: Profile) -> Profile:
        """``base`` with only ``worker`` drafting, over its own link."""
        return replace(base, workers=(Machine(worker.title, worker.curve),), link_rtt_s=worker.link_rtt_s)
