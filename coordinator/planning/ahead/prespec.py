"""Pre-speculation, predicted: which branches a worker drafts before the verdict comes back, and what
the round still waits for.

The worker (``specwire.drafting.ahead.speculation``) ranks the verdicts the target may give
to the drafts it just sent, most likely first: a drafts accepted with
probability alpha^a (1 - alpha) (alpha^k for all), and then the target's own
token, which is the draft's second choice, third, ... with the probabilities
the pair's agreement gives (``Outcomes``). It spends one forward pass at a
time: the bonus probe (the draft's distribution after all k drafts), then the
most likely branch until its k drafts are done, then the next. The verdict
reaches it ``window_s`` after it sent the drafts (the target's verification,
the engine's bookkeeping, the link and the protocol).

Then, for the verdict the target gave: a branch with all k drafts is a hit
(no compute: the worker computes on a thread of its own and answers at once); a
branch under way is a partial hit (the pass in flight ends, the
branch is finished); otherwise a miss (the pass in flight ends, k drafts on
demand). ``schedule`` turns this into the fractions of rounds of each kind and
the drafting left on the critical path, which ``model.round_parts`` adds up.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Outcomes:
    """The probabilities of the target's verdicts on k drafts.

    ``alpha`` is the per-draft acceptance; ``choice(j)`` is the probability
    that the target's token is the draft's j-th most likely (j = 1: its
    first choice), from the pair's top-1/2/4 agreement; after a rejection the
    first choice is excluded, so the others are renormalised.
    """

    alpha: float
    agreement: dict[str, float]

    def choice(self, j: int) -> float:
        """P(the target's token is the draft's j-th choice), j >= 1."""
        top1 = self.agreement.get("top1", self.alpha)
        top2 = self.agreement.get("top2", top1)
        top4 = self.agreement.get("top4", top2)
        if 5 <= j <= 8:  # only where the pair's top-8 agreement was measured
            return (self.agreement.get("top8", top4) - top4) / 4
        return {1: top1, 2: top2 - top1, 3: (top4 - top2) / 2, 4: (top4 - top2) / 2}.get(j, 0.0)

    def accepted(self, a: int, k: int) -> float:
        """P(exactly a of k drafts accepted)."""
        return self.alpha**k if a == k else self.alpha**a * (1 - self.alpha)

    def correction(self, j: int) -> float:
        """P(the correction after a rejection is the draft's j-th choice), j >= 2."""
        return self.choice(j) / max(1e-12, 1 - self.choice(1))


@dataclass(frozen=True)
class Schedule:
    """What pre-speculation leaves on the critical path of a round, on average."""

    hit: float  # fraction of rounds served whole from a branch
    partial: float  # fraction that finished a branch begun ahead
    on_demand_passes: float  # draft passes still run after the verdict, per round
    in_flight_s: float  # wait for the speculative pass in flight, per round


def schedule(
    outcomes: Outcomes,
    k: int,
    draft_s: float,
    window_s: float,
    budget: int = 0,
    fanout: int = 2,
    batch: int = 1,
) -> Schedule:
    """The worker's passes by ``window_s``, and the expected round that follows (module docstring)."""
    budget = budget or 2 * k + 1
    done = math.floor(window_s / draft_s + 1e-9)
    spent = min(done, budget)
    in_flight = (done + 1) * draft_s - window_s if done < budget else 0.0
    progress = _branch_passes(outcomes, k, fanout, min(done + 1, budget), batch)  # passes per branch
    at_window = _branch_passes(outcomes, k, fanout, spent, batch)
    hit = partial = demand = wait = 0.0
    covered = 0.0
    for branch, p in _branches(outcomes, k, fanout):
        ready = at_window.get(branch, 0) >= k
        if ready:
            hit += p
            covered += p
            continue
        after = progress.get(branch, 0)  # the pass in flight ends first
        wait += p * in_flight
        covered += p
        if after >= k:
            hit += p  # the pass in flight finished it: served whole, once it ended
        elif after > 0:
            partial += p
            demand += p * (k - after)
        else:
            demand += p * k
    miss = max(0.0, 1.0 - covered)
    return Schedule(hit, partial, demand + miss * k, wait + miss * in_flight)


def _branches(outcomes: Outcomes, k: int, fanout: int) -> list[tuple[tuple[int, int], float]]:
    """Every verdict a branch can be drafted for, with its probability: (accepted, choice rank)."""
    out = [((k, j), outcomes.accepted(k, k) * outcomes.choice(j)) for j in range(1, fanout + 1)]
    for a in range(k):
        out += [((a, j), outcomes.accepted(a, k) * outcomes.correction(j)) for j in range(2, fanout + 2)]
    return out


def _branch_passes(
    outcomes: Outcomes, k: int, fanout: int, passes: int, batch: int = 1
) -> dict[tuple[int, int], int]:
    """Forward passes spent on each branch after ``passes`` speculative passes, in the worker's order."""
    if batch > 1:
        return _batched_passes(outcomes, k, fanout, passes, batch)
    order = itertools.count()
    queue: list[tuple[float, int, tuple[int, int] | None]] = [(-outcomes.accepted(k, k), next(order), None)]
    for a in range(k):
        for j in range(2, fanout + 2):
            queue.append((-outcomes.accepted(a, k) * outcomes.correction(j), next(order), (a, j)))
    heapq.heapify(queue)
    spent: dict[tuple[int, int], int] = {}
    for _ in range(passes):
        if not queue:
            break
        value, _, branch = queue[0]
        if branch is None:  # the bonus probe: one pass, then the bonus branches join the queue
            heapq.heappop(queue)
            for j in range(1, fanout + 1):
                heapq.heappush(queue, (value * outcomes.choice(j), next(order), (k, j)))
            continue
        spent[branch] = spent.get(branch, 0) + 1
        if spent[branch] >= k:
            heapq.heappop(queue)
    return spent


def _batched_passes(
    outcomes: Outcomes, k: int, fanout: int, passes: int, batch: int
) -> dict[tuple[int, int], int]:
    """As ``_branch_passes`` for branches drafted ``batch`` to a pass
    (``specwire.drafting.ahead.branch_batch``).

    Each pass runs every row in the batch; free rows go to the most likely
    branches not yet begun. The probe takes a row of the first pass, and the
    bonus branches can begin from the pass after it.
    """
    waiting = [
        (outcomes.accepted(a, k) * outcomes.correction(j), (a, j))
        for a in range(k)
        for j in range(2, fanout + 2)
    ]
    rows: list[tuple[int, int] | None] = [None]  # None: the probe
    spent: dict[tuple[int, int], int] = {}
    for _ in range(passes):
        waiting.sort(key=lambda item: -item[0])
        while len(rows) < batch and waiting:
            rows.append(waiting.pop(0)[1])
        if not rows:
            break
        for branch in rows:
            if branch is None:
                bonus = outcomes.accepted(k, k)
                waiting += [(bonus * outcomes.choice(j), (k, j)) for j in range(1, fanout + 1)]
            else:
                spent[branch] = spent.get(branch, 0) + 1
        rows = [b for b in rows if b is not None and spent[b] < k]
    return spent


@dataclass(frozen=True)
class FillSchedule:
    """Fill mode, in the long run: the fractions of rounds served whole, in part and not at all, and the
    drafts the target's machine makes per round (``coordinator.drafting.fill``)."""

    hit: float
    partial: float
    miss: float
    filled: float  # drafts per round made on the target's machine


def fill_schedule(
    outcomes: Outcomes,
    k: int,
    draft_s: float,
    ahead_s: float,
    local_s: float,
    window_s: float,
    budget: int = 0,
    fanout: int = 2,
    batch: int = 1,
) -> FillSchedule:
    """The rounds of a fill-mode worker, as a Markov chain over the drafts it served last round.

    A round that served r of k drafts leaves the worker k - r passes (``draft_s``
    each) to finish that block before it plans; meanwhile the target's machine
    drafts the same k - r (``local_s`` each) before verifying, so the next
    verdict reaches the worker ``window_s`` + (k - r) ``local_s`` after its
    answer. What is left goes to branches (``ahead_s`` a pass, ``batch`` side
    by side); the verdict then finds its branch with some drafts ready, or none.
    """
    budget = budget or 2 * k + 1
    moves = []
    for served in range(k + 1):
        spare = window_s + (k - served) * (local_s - draft_s)
        passes = min(budget, max(0, math.floor(spare / ahead_s + 1e-9)))
        spent = _branch_passes(outcomes, k, fanout, passes, batch)
        row = [0.0] * (k + 1)
        for branch, p in _branches(outcomes, k, fanout):
            row[min(k, spent.get(branch, 0))] += p
        row[0] += max(0.0, 1.0 - sum(row))
        moves.append(row)
    share = [1.0 / (k + 1)] * (k + 1)
    for _ in range(200):  # the chain's long-run shares (it mixes in a few steps)
        nxt = [sum(share[i] * moves[i][j] for i in range(k + 1)) for j in range(k + 1)]
        settled = max(abs(a - b) for a, b in zip(nxt, share, strict=True)) < 1e-12
        share = nxt
        if settled:
            break
    return FillSchedule(
        hit=share[k],
        partial=sum(share[1:k]),
        miss=share[0],
        filled=sum(share[r] * (k - r) for r in range(k + 1)),
    )
