"""What the drafting policy chooses by: the measured set-up and every set-up's prediction.

``Planner`` holds what the coordinator knows across generations: this set-up
as measured at warm-up (``coordinator.planning.measured``: the target's
verification curve, the local draft's pass, the pair's agreement, each
worker's advertised pass curve and measured link), and the predictions of
every set-up it could run (``coordinator.planning.setups``), cached by
temperature and acceptance, and what each drafting session measured against
its prediction when auto ran it (``learn``, ``share``), so that a later
generation starts from what was measured. ``--draft auto`` (``coordinator.drafting.auto``)
and ``coordinator plan`` read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from coordinator.planning.measured import MeasuredSetup, WorkerSpeed
from coordinator.planning.setups import (
    MODES,
    TREE_KS,
    Predicted,
    Setup,
    candidates,
    predict_setup,
    ranked,
)

START_MARGIN = 0.03  # at the start, the simplest set-up predicted within this of the fastest is taken
ALPHA_STEP = 0.02  # predictions are cached at this resolution of acceptance
SHARE_ROUNDS = 32  # a session's share: the moving mean of its windows (one a round) over about this many
FORGET_ROUNDS = 1024  # rounds after which a session's share is forgotten (and it may be tried again)

Session = tuple[str, str]  # a drafting session: the mode and the worker (its k may change within it)


@dataclass(frozen=True)
class Share:
    """A session's measured tok/s over its predicted: the moving mean of its windows, how many it holds
    (up to ``SHARE_ROUNDS``), and the planner's round count when it was last measured."""

    value: float
    windows: int
    round: int


class Planner:
    """The measured set-up and the predictions the policy chooses by, kept across generations."""

    def __init__(self, measured: MeasuredSetup, modes: Sequence[str] | None = None) -> None:
        self.measured = measured
        self.modes = tuple(modes) if modes is not None else None
        self._ranking: dict[tuple[bool, float, float, frozenset[str]], list[Predicted]] = {}
        self._prior: dict[float, float] = {}
        self._trees: dict[tuple[float, str, str], Predicted] = {}  # by temperature, worker, mode
        self.rounds = 0  # rounds decoded by auto under this planner, every generation together
        self.shares: dict[Session, Share] = {}  # what each session measured against its prediction
        self.bias = 1.0  # what a session never measured is expected at: the last share the text explained

    def learn(self, session: Session, share: float) -> Share:
        """One window of ``session``: its tok/s over its prediction, folded into the session's mean."""
        seen = self.share(session)
        if seen is None:
            learned = Share(share, 1, self.rounds)
        else:
            windows = min(SHARE_ROUNDS, seen.windows + 1)
            learned = Share(seen.value + (share - seen.value) / windows, windows, self.rounds)
        self.shares[session] = learned
        return learned

    def rescale(self, session: Session, share: float) -> None:
        """Set ``session``'s mean to ``share``, keeping its weight: what it measured, set against a
        set-up measured around it on the same text (``AutoDraftSource``)."""
        seen = self.shares.get(session)
        if seen is not None:
            self.shares[session] = Share(share, seen.windows, self.rounds)

    def forget(self, session: Session) -> None:
        """Drop what ``session`` measured: a try that was not confirmed (``AutoDraftSource``)."""
        self.shares.pop(session, None)

    def share(self, session: Session) -> Share | None:
        """What ``session`` measured against its prediction, unless that was ``FORGET_ROUNDS`` ago."""
        seen = self.shares.get(session)
        return seen if seen is not None and self.rounds - seen.round < FORGET_ROUNDS else None

    def prior(self, temperature: float) -> float:
        """The calibrated per-draft acceptance at ``temperature``."""
        key = round(max(0.0, temperature), 2)
        if key not in self._prior:
            self._prior[key] = self.measured.alpha(key)
        return self._prior[key]

    def ranking(
        self, temperature: float, alpha: float, lost: frozenset[str] = frozenset()
    ) -> list[Predicted]:
        """Every set-up this machine and its workers (but ``lost``) can run, predicted, fastest first."""
        greedy = temperature <= 0
        a = round(min(0.99, max(0.01, alpha)) / ALPHA_STEP) * ALPHA_STEP
        key = (greedy, round(max(0.0, temperature), 2), round(a, 4), lost)
        if key not in self._ranking:
            self._ranking[key] = self._rank(temperature, a, lost)
        return self._ranking[key]

    def _rank(self, temperature: float, alpha: float, lost: frozenset[str]) -> list[Predicted]:
        base = self.measured.profile(temperature, alpha)
        modes = self.modes if self.modes is not None else MODES
        trees = self.measured.trees
        here = [m for m in modes if m in ("ar", "local", "local-tree")]
        out = ranked(base, [s for s in candidates(base, temperature <= 0, here, trees=trees) if not s.remote])
        for worker in self.measured.workers:
            if worker.title in lost:
                continue
            profile = self.measured.profile_for(worker, base)
            no_tree = () if worker.tree else (worker.title,)
            # A worker on this machine computes on its processors: drafting there while the target
            # verifies overlaps nothing, so only drafting on demand is planned for it.
            own = ("stream",) if worker.colocated else modes
            setups = [s for s in candidates(profile, temperature <= 0, own, no_tree, trees) if s.remote]
            out += ranked(profile, [s for s in setups if s.mode == "stream"])
            if any(s.mode == "tree" for s in setups):
                out.append(self._tree(temperature, alpha, worker))
            verify = next((s for s in setups if s.mode == "tree-verify"), None)
            if verify is not None:
                out.append(self._tree_verify(temperature, alpha, verify))
        return sorted(out, key=lambda p: -p.tok_s)

    def _tree(self, temperature: float, alpha: float, worker: WorkerSpeed) -> Predicted:
        """The worker's tree set-up: its Monte Carlo at the calibrated acceptance, at the k it predicts
        best there (once per process; that k is kept), moved to ``alpha`` as fill at that k moves (the
        Monte Carlo is too slow to run between rounds, and its k by acceptance was not borne out on the
        paced test bed: k = 1 and 3 measured well below 2 where the move predicted them faster)."""
        prior = self.prior(temperature)
        at_prior = self.measured.profile_for(worker, self.measured.profile(temperature, prior))
        key = (round(temperature, 2), worker.title, "tree")
        if key not in self._trees:
            trees = [Setup("tree", k, worker.title) for k in TREE_KS]
            self._trees[key] = max(
                (Predicted(s, predict_setup(at_prior, s)) for s in trees), key=lambda p: p.tok_s
            )
        best = self._trees[key]
        now = self.measured.profile_for(worker, self.measured.profile(temperature, alpha))
        fill = replace(best.setup, mode="fill")
        return Predicted(best.setup, best.tok_s * predict_setup(now, fill) / predict_setup(at_prior, fill))

    def _tree_verify(self, temperature: float, alpha: float, setup: Setup) -> Predicted:
        """The worker's tree verified in one pass: its Monte Carlo at the calibrated acceptance (once per
        process), moved to ``alpha`` as local tree SD moves (its rounds without a ready tree are local
        trees, and the Monte Carlo is too slow to run between rounds)."""
        prior = self.prior(temperature)
        key = (round(temperature, 2), setup.worker, setup.mode)
        worker = next(w for w in self.measured.workers if w.title == setup.worker)
        if key not in self._trees:
            at_prior = self.measured.profile_for(worker, self.measured.profile(temperature, prior))
            self._trees[key] = Predicted(setup, predict_setup(at_prior, setup))
        local = Setup("local-tree", setup.k)
        then = predict_setup(self.measured.profile(temperature, prior), local)
        now = predict_setup(self.measured.profile(temperature, alpha), local)
        return Predicted(setup, self._trees[key].tok_s * now / then)


def simplest_near_best(ranking: list[Predicted], margin: float = START_MARGIN) -> Predicted:
    """The simplest set-up (AR, local SD, then the remote modes in order) predicted within ``margin`` of
    the fastest (``START_MARGIN``: a worker is not taken for a gain within the model's error)."""
    best = max(p.tok_s for p in ranking)
    near = [p for p in ranking if p.tok_s >= best * (1 - margin)]
    simplest = min(MODES.index(p.setup.mode) for p in near)
    return max((p for p in near if MODES.index(p.setup.mode) == simplest), key=lambda p: p.tok_s)


def session_of(setup: Setup) -> Session:
    """A session: the mode and the worker (k may change within it)."""
    return setup.mode, setup.worker


def sessions(ranking: list[Predicted]) -> list[Predicted]:
    """The best k of each session, fastest first."""
    seen: set[Session] = set()
    out = []
    for p in ranking:
        if session_of(p.setup) not in seen:
            seen.add(session_of(p.setup))
            out.append(p)
    return out
