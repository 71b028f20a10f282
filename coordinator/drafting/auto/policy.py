"""``--draft auto``: decode with the set-up the performance model predicts fastest, and re-decide as
rounds are measured.

``Planner`` (``coordinator.planning.planner``) holds what the coordinator
knows across generations: this set-up as measured at warm-up, and the
predictions of every set-up it could run.

``AutoDraftSource`` is the draft source of one generation. It starts on the
set-up expected fastest (AR, local SD, local tree SD, or a worker in one of
the stream protocol's modes, with its k), each predicted and scaled by what
its session measured in earlier generations (the rule is below). It tells the engine each round's k (0 for an
autoregressive round). After every round it learns:

* the pair's acceptance (a moving average of accepted per drafted, from
  chain rounds: a tree's accepted path may take any of the draft's choices),
  which moves every prediction;
* the current session's measured tok/s over its last ``WINDOW`` rounds, as a
  share of what the model predicts for it, from which every set-up is
  expected now (``expected``: the shares, how the text runs, slow workers).

It moves to another session (mode and worker) when that one is expected
``MARGIN`` faster than the current one, at most once per window of rounds;
at once when a worker is lost (never to it again in this generation); and
within a session to the k predicted fastest. A session never measured and
expected within ``PROBE`` of the current one (the planner's error) is tried
for one window: the planner cannot rank set-ups closer than its own error,
and each try is paid once per ``FORGET_ROUNDS`` of the planner, not per
generation. A worker's set-up is tried only where a window at the top of
that error would be kept (below), since any other try costs its window and
changes nothing. Where to be, at a generation's start as after a try, is the
best set-up without a worker unless a worker's is expected ahead of it by
``START_MARGIN`` (``MARGIN`` once measured): close set-ups measure apart by
their text as much as by their speed, so a worker is kept only where it
measured clearly ahead. After a run of tries the set-up the tries left is
measured again first, and each tried set-up's share is set to its window's
ratio to the mean of the incumbent's windows on both sides of the tries
(A, B, C, A: a text that comes easier as it goes on favours whatever is
measured later); the best is moved to if that ratio leads by that margin.
A try begins only where the generation has room for it and that second
look (``TRY_ROUNDS`` each; the engine says how many tokens are left). In
AR, the acceptance estimate drifts back to the calibrated one, so drafting
is tried again. Every move is kept with its reason.
Switching opens the new set-up's session from the whole context so far; the
target never notices, so the output is what the target's own decoding gives
(T = 0: token for token; T > 0: the same distribution, each round's
rejection sampling being exact whatever drafted).

The sessions themselves are ``moves.Moves``'s: a move to a worker's fill
session is opened ahead while the current set-up decodes (a worker prefills
the whole context before it answers: 56-134 ms a move on the paper's preset,
on the critical path, when the move waited for it), and a set-up on this
machine that a move leaves is kept and caught up if the generation comes
back to it (20-23 ms of prefill a return on that preset; measurements.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from coordinator.decoding.results import RoundRecord
from coordinator.drafting.auto.expected import Expectations
from coordinator.drafting.auto.moves import Moves
from coordinator.drafting.auto.report import Decision, Segment, Switch
from coordinator.drafting.auto.tries import Tries, kept_after_look, lead_needed
from coordinator.drafting.auto.window import RoundWindow
from coordinator.drafting.base import DraftSource, Outcome
from coordinator.planning.planner import (
    START_MARGIN,
    Planner,
    session_of,
    sessions,
    simplest_near_best,
)
from coordinator.planning.setups import (
    CHAIN_KS,
    Predicted,
    Setup,
)
from specwire.drafting.drafter import DraftBlock
from specwire.drafting.sampling import SamplingParams
from specwire.logits.processors import Processing

log = logging.getLogger(__name__)

AUTO_K = max(CHAIN_KS)  # the most drafts a round of auto's asks for (what the engine warms for)
WINDOW = 8  # rounds the current set-up's tok/s is measured over
SETTLE = 2  # rounds after a switch before its window counts (the session's start overlaps them)
MARGIN = 0.10  # another set-up must be expected this much faster before the policy moves to it
PROBE = 0.10  # a session never measured, expected within this of the current one, is tried for a window
TRY_ROUNDS = 2 + SETTLE + WINDOW + 1  # a try's rounds: its session opened ahead, settled, and measured
ALPHA_DECAY = 0.97  # per round, of the acceptance estimate's counts (accepted drafts, rejections)
PRIOR_REJECTIONS = 6.0  # the calibrated acceptance weighs as much as this many rounds' rejections
K_GAIN = 0.03  # a k predicted at least this much faster than the current one replaces it
RERANK = 0.05  # the predictions in use are redone once the acceptance estimate has moved this far
AR_DRIFT = 1 / 32  # per AR round, the acceptance estimate moves this share back to the calibrated one


class AutoDraftSource:
    """The drafting policy's source for one generation at a time (module docstring)."""

    name = "auto"

    def __init__(self, planner: Planner, build: Callable[[Setup], DraftSource | None]) -> None:
        self.planner = planner
        self.decision = Decision("AR")
        self._moves = Moves(build, self)  # the sessions and the moves between them
        self._accepted = self._rejections = 0.0
        self._prior = (0.0, PRIOR_REJECTIONS)
        self._temperature = 0.0
        self._since_switch = 0
        self._window = RoundWindow(WINDOW)  # the current set-up's rounds since it settled
        self._expect = Expectations(planner)  # each set-up's tok/s now, from what was measured
        self._probed: Setup | None = None  # the session being tried for a window (PROBE), if one is
        self._ranked: tuple[float, frozenset[str], list[Predicted], list[Predicted]] | None = None
        self._tries = Tries(planner)  # the tries and their second look
        self._left = 1 << 30  # tokens the generation has still to make (``k_now``)

    @property
    def current(self) -> Setup:
        """The set-up drafting now (AR when no session is open)."""
        return self._moves.current

    @property
    def source(self) -> DraftSource | None:
        """The current set-up's session (None: AR)."""
        return self._moves.source

    @property
    def switches(self) -> list[Switch]:
        """Every move of this generation, with its reason."""
        return self._moves.switches

    @property
    def segments(self) -> list[Segment]:
        """The stretches of rounds each set-up served in this generation."""
        return self._moves.segments

    # The engine's side: a draft source that also says each round's k.

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        """Choose the set-up for this generation and open it with the prompt."""
        self._temperature = 0.0 if params.greedy else params.temperature
        self._moves.begin(prompt, params)
        self._expect.reset()
        self._probed, self._ranked = None, None
        alpha = self.planner.prior(self._temperature)
        self._prior = (PRIOR_REJECTIONS * alpha / max(1e-3, 1 - alpha), PRIOR_REJECTIONS)
        self._accepted, self._rejections = self._prior
        expected = sorted(
            (replace(p, tok_s=self._expect.expected(p, self._moves.round)) for p in self._ranking()),
            key=lambda p: -p.tok_s,
        )
        first = self._choice(expected)
        measured = self._expect.share(first.setup) is not None
        rest = [p for p in sessions(expected) if session_of(p.setup) != session_of(first.setup)]
        self.decision = Decision(
            first.setup.label, [(p.setup.label, round(p.tok_s, 2)) for p in [first, *rest[:2]]]
        )
        reason = "predicted fastest" if first is expected[0] else "predicted as fast, simpler"
        self._moves.enter(first.setup, f"{reason}, as measured before" if measured else reason)

    def use_processing(self, processing: Processing | None) -> None:
        """The next generation's penalties and grammar (before ``start``), offered to every set-up it
        opens, on a worker too."""
        self._moves.processing = processing

    def k_now(self, left: int) -> int:
        """Drafts this round asks for (0: an autoregressive round), with ``left`` tokens still to generate."""
        self._left = left
        return self.current.k if self.source is not None else 0

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Draft on the current set-up; a worker lost on the way costs its set-up, never the round."""
        return self._moves.propose(k, outcome)

    def record(self, r: RoundRecord) -> None:
        """Learn from one finished round, then maybe move to another set-up."""
        self._moves.advance(r.tokens)
        self._left -= len(r.tokens)
        self.planner.rounds += 1
        self._since_switch += 1
        if r.draft.tree is not None:
            pass  # a tree's path may take any of the draft's choices: no measure of its first choice's
        elif r.drafted:
            self._accepted = ALPHA_DECAY * self._accepted + r.accepted
            self._rejections = ALPHA_DECAY * self._rejections + (r.accepted < r.drafted)
        elif self.source is None:  # drafting is tried again once the estimate drifts back
            self._accepted += AR_DRIFT * (self._prior[0] - self._accepted)
            self._rejections += AR_DRIFT * (self._prior[1] - self._rejections)
        if self._since_switch > SETTLE:
            self._window.append(len(r.tokens), r.end_ns, r.draft_ns)
        self._decide()

    def close(self) -> None:
        """End the current session, one opening ahead, and those kept on this machine. Tries the
        generation ended before their second look (``_measure_again``) settled are forgotten, and set-ups
        never measured are expected at the incumbent's share again: measured on one side only, a try is
        no measure (a later generation may try it again; ``_room`` makes that rare)."""
        self._moves.close()
        self._tries.end()

    # The policy.

    @property
    def alpha(self) -> float:
        """The per-draft acceptance estimate: decayed accepted drafts over accepted plus rejections."""
        total = self._accepted + self._rejections
        return self._accepted / total if total > 0 else 0.0

    def _ranking(self) -> list[Predicted]:
        """The predictions in use (``_ranking_and_heads``)."""
        return self._ranking_and_heads()[0]

    def _ranking_and_heads(self) -> tuple[list[Predicted], list[Predicted]]:
        """The predictions in use, and the best k of each session among them (``sessions``): redone when
        a worker was lost or the acceptance moved ``RERANK`` (each costs milliseconds of the round it is
        made in)."""
        lost = frozenset(self._moves.lost)
        held = self._ranked
        if held is None or held[1] != lost or abs(held[0] - self.alpha) >= RERANK:
            ranking = self.planner.ranking(self._temperature, self.alpha, lost)
            self._ranked = held = (self.alpha, lost, ranking, sessions(ranking))
        return held[2], held[3]

    def _learn_share(self, ranking: list[Predicted], measured: float | None) -> None:
        """The current set-up's tok/s over its window (``measured``), as a share of its prediction."""
        predicted = next((p.tok_s for p in ranking if p.setup == self.current), 0.0)
        if measured is not None and predicted > 0:
            waited = self._window.waited_share()
            self._expect.learn(self.current, measured / predicted, waited, self._moves.round)

    def _decide(self) -> None:
        ranking, heads = self._ranking_and_heads()  # a session's set-ups share its factor: its best k stands
        measured = self._window.tok_s()
        self._learn_share(ranking, measured)
        if self._moves.opening_ahead:  # the move is decided: made once the worker has answered
            self._moves.await_ahead()
            return
        current = session_of(self.current)
        mine = [p for p in ranking if session_of(p.setup) == current]  # fastest k first
        others = [p for p in heads if session_of(p.setup) != current]
        settled = self._since_switch > SETTLE + WINDOW
        if settled and mine and others:
            by_setup = {
                p.setup: self._expect.expected(p, self._moves.round) for p in heads
            }  # once: this runs every round

            def expected(p: Predicted) -> float:
                return by_setup[p.setup]

            now, best = expected(mine[0]), max(others, key=expected)
            seen = f"measured {measured:.1f} tok/s" if measured is not None else "not measured"
            tried, self._probed = self._probed, None
            if tried is not None and measured is not None:
                self._tries.measured(self.current, measured)
            elif self._tries.look is not None and measured is not None:  # the incumbent measured again
                self._settle_look(ranking, measured)
                return
            chosen = self._choice([replace(p, tok_s=expected(p)) for p in heads])
            incumbent = self._tries.before[0] if tried is not None and self._tries.before else self.current
            # the incumbent's expected tok/s (its session's head; ``now`` where it is the current one): a
            # try is kept only over it (``_settle_look``)
            at = next((expected(p) for p in heads if session_of(p.setup) == session_of(incumbent)), now)
            untried = [
                p
                for p in others
                if self._expect.untried(p) and self._could_be_kept(p.setup, expected(p), at, incumbent)
            ]
            probe = max(untried, key=expected, default=None)
            if probe is not None and expected(probe) < chosen.tok_s * (1 - PROBE):
                probe = None
            if probe is not None and not self._room():  # a try and its second look would not fit
                probe = None
            if tried is not None and probe is not None:  # the next try straight away: one move, not two
                self._try(probe.setup, expected(probe), chosen, f"tried {self.current.label}: {seen}")
                return
            if tried is not None and self._measure_again(chosen.setup, seen):
                return
            if tried is not None and session_of(chosen.setup) != session_of(
                self.current
            ):  # after a try: as at a start
                self._moves.enter(
                    chosen.setup,
                    f"tried {self.current.label}: expected {now:.1f} tok/s ({seen}); {chosen.setup.label} "
                    f"expected {chosen.tok_s:.1f}, the simplest measured within {MARGIN:.0%} of the best",
                    ahead=True,
                )
                return
            if tried is None and expected(best) > now * (1 + MARGIN):
                self._moves.enter(
                    best.setup,
                    f"{self.current.label} expected {now:.1f} tok/s ({seen}); {best.setup.label} expected "
                    f"{expected(best):.1f} (acceptance {self.alpha:.2f})",
                    ahead=True,
                )
                return
            if tried is None and probe is not None and expected(probe) >= now * (1 - PROBE):
                self._tries.begin(self.current, measured)
                self._try(probe.setup, expected(probe), replace(mine[0], setup=self.current, tok_s=now), seen)
                return
        at_k = next((p.tok_s for p in mine if p.setup == self.current), 0.0)
        if self.source is not None and mine and mine[0].tok_s > at_k * (1 + K_GAIN):
            self._switch_k(mine[0].setup)

    def _could_be_kept(self, setup: Setup, expected: float, incumbent_tok_s: float, incumbent: Setup) -> bool:
        """Whether a try of ``setup``, never measured and expected at ``expected`` tok/s, could be kept over
        ``incumbent``, the set-up the tries leave (expected at ``incumbent_tok_s``): for a worker's set-up,
        a window at the top of the planner's error (``PROBE``) would lead it by ``_settle_look``'s margin.
        Any other try of a worker costs its window and changes nothing: on the paper's preset (2026-11-29)
        auto tried the M1 Max's tree, expected at 61.7 tok/s against local tree SD's 61.9, which a worker
        needs to lead by ``MARGIN``, and its first generation made 0.94 of local tree SD's. A set-up
        without a worker keeps the ``PROBE`` band alone: ``_choice`` keeps one measured within ``MARGIN``
        of a worker's as the simpler."""
        if not setup.remote:
            return True
        return expected * (1 + PROBE) > incumbent_tok_s * (
            1 + lead_needed(setup, incumbent, MARGIN, START_MARGIN)
        )

    def _try(self, setup: Setup, expected: float, against: Predicted, seen: str) -> None:
        """Try ``setup``, never measured, for a window: it is expected within ``PROBE`` of ``against``."""
        self._probed = setup
        self._moves.enter(
            setup,
            f"trying {setup.label}, never measured: expected {expected:.1f} tok/s, within {PROBE:.0%} of "
            f"{against.setup.label}'s {against.tok_s:.1f} ({seen})",
            ahead=True,
        )

    def _measure_again(self, chosen: Setup, seen: str) -> bool:
        """After a run of tries: back to the set-up the tries left, to measure it again on the text since
        before any tried one is kept or ranked by its window (``tries``)."""
        look = self._tries.second_look(chosen, self._moves.lost)
        if look is None:
            return False
        incumbent, before = look.before
        self._moves.enter(
            incumbent,
            f"tried {self.current.label} ({seen}); {incumbent.label} measured again on the text since, "
            f"against its {before:.1f} before the tries ({look.windows()}): a tried set-up is kept only if "
            "ahead of its windows on both sides",
            ahead=True,
        )
        return True

    def _settle_look(self, ranking: list[Predicted], measured: float) -> None:
        """The incumbent measured again after the tries: move to the try ``kept_after_look`` keeps."""
        look = self._tries.look
        assert look is not None
        before = look.before[1]
        ratios = self._tries.settle(self.current, ranking, measured)
        kept = kept_after_look(ratios, self.current, self._moves.lost, MARGIN, START_MARGIN)
        if kept is not None:
            setup, ratio = kept
            tok_s = look.tried[session_of(setup)][1]
            self._moves.enter(
                setup,
                f"{setup.label} measured {tok_s:.1f} tok/s, {ratio - 1:.0%} ahead of "
                f"{self.current.label}'s windows around the tries ({before:.1f}, {measured:.1f})",
                ahead=True,
            )
            return
        log.info(
            "drafting: staying on %s, measured %.1f and %.1f tok/s around the tries (%s)",
            self.current.label,
            before,
            measured,
            look.windows(),
        )

    def _choice(self, expected: list[Predicted]) -> Predicted:
        """Where to be, of ``expected`` (predictions times measured shares): the best set-up without a
        worker (the simplest within START_MARGIN of the best of them) unless a worker's is expected ahead
        of it by more than START_MARGIN, or by more than MARGIN once that set-up has been measured; else
        the simplest within START_MARGIN of the best. Close set-ups measure apart by their text as much as
        by their speed, so a worker is kept only where it measured clearly ahead; between set-ups on this
        machine alone nothing is at stake but their speed (a chain kept within MARGIN of a local tree
        on the paper's preset, auto started four of six generations on a chain measured within MARGIN of
        local tree SD and made 0.94 of it)."""
        best = max(p.tok_s for p in expected)
        here = [p for p in expected if not p.setup.remote]
        if here:
            local = simplest_near_best(here)
            margin = MARGIN if self._expect.share(local.setup) is not None else START_MARGIN
            if local.tok_s >= best * (1 - margin):
                return local
        return simplest_near_best(expected)

    def _room(self) -> bool:
        """Whether the generation has rounds left for a try and the incumbent's second look (``TRY_ROUNDS``
        each, at the tokens a round the window measured): a look the generation ends before compares
        nothing, and its tries are forgotten."""
        return self._left / max(self._window.tokens_per_round(), 1.0) >= 2 * TRY_ROUNDS

    def _switch_k(self, setup: Setup) -> None:
        """The same session at another k: nothing to reopen."""
        self._moves.switch_k(setup, f"acceptance {self.alpha:.2f}: k={setup.k} predicted faster")

    # What the sessions ask of the policy (``moves.Policy``).

    def next_best(self) -> Setup:
        """The best set-up without the workers lost."""
        return self._ranking()[0].setup

    def moved(self) -> None:
        """A move: the new set-up's window starts afresh."""
        self._since_switch = 0
        self._window.clear()

    def worker_lost(self, opening_ahead: bool) -> None:
        """A lost worker ends a try of its set-up (opening ahead) or the tries' second look."""
        if opening_ahead:
            self._probed = None
        else:
            self._tries.drop()

    # What a generation reports.

    def report(self) -> dict[str, object]:
        """The set-up chosen and why, every switch with its reason, and where it ended."""
        return {
            "chosen": self.decision.to_dict(),
            "final": self.current.label,
            "switches": [s.__dict__ for s in self.switches],
            "acceptance_estimate": round(self.alpha, 3),
        }


def predicted_start(planner: Planner, temperature: float) -> Predicted:
    """The set-up a generation at ``temperature`` starts on, with its predicted tok/s: what ``start``
    chooses before any round is measured (the calibrated acceptance, no worker lost)."""
    t = max(0.0, temperature)
    return simplest_near_best(planner.ranking(t, planner.prior(t)))
