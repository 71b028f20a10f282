"""Tree verification, predicted from a hardware profile: local tree SD, and workers' trees verified in
one target pass.

The pair is taken as the ceiling takes it (``planning.ahead.ceiling``): at each
position the target's token is the draft's j-th choice with the pair's
agreement (``shares``: alpha for the first choice, then the corrections),
independently of other positions, so a node lies on the target's path with
the product of the shares along its path, and a round's expected accepted
drafts are the sum of its nodes' chances.

* Local tree SD (``coordinator.drafting.local_tree``): the target machine's
  draft model grows the tree a pass per depth, expanding the ``width``
  likeliest nodes of the deepest level; the round verifies the ``n`` best
  nodes. Depth and ``n`` are those that give the most tokens a second, as the
  source's own rule chooses them. The tree is the same every round, so this
  is closed form.

Both add the coordinator's own time a tree round costs beyond a chain round's
(``HOST_S``).
* A worker's tree (``coordinator.drafting.remote_tree``): a seeded Monte
  Carlo over rounds. The workers expand the likeliest nodes of one tree,
  ``rows`` a pass, back to back, at most ``budget`` passes after a verdict
  (``planning.ahead.ceiling``'s tree, with several workers sharing it and no node
  expanded twice); each round the target
  verifies the best nodes the workers have expanded under the verdict, as
  many as pay on its curve; where they have none, a local tree as above. The
  workers hear the verdict a window after the round starts (verification,
  engine, link, protocol).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coordinator.planning import profile as planned
from coordinator.planning.ahead.ceiling import RankNode, RankTree, Worker, rank_shares, target_rank
from coordinator.planning.ahead.prespec import Outcomes
from specwire.drafting.ahead.draft_tree import DEFAULT_PASSES
from specwire.drafting.ahead.prespec_config import CURVE_ROWS, MAX_BATCH, TREE_ROWS
from specwire.emulation.profile import SAME_COST, Machine, PassCurve, Profile, measured_pass_s, non_decreasing

LOCAL_NODES, LOCAL_WIDTH = 16, 4  # the local tree's defaults (coordinator.drafting.local_tree)
REPLY_NODES = 64  # the most nodes a worker's tree reply carries (coordinator.drafting.factory)
TREE_VERIFY_WIDTH = 8  # choices a worker's tree keeps of each node (its session's fanout + 1)
# The coordinator's own time in a tree round beyond a chain round's (the tree's mask, the cache's
# compaction, sizing, the walk): 3.1 ms measured on the paced test bed (2026-11-25, 2-core VM, the
# tiny-draft-specinfer pair: 42.1 ms a local tree round where its passes take 37.9; a chain round 1.1
# ms over its passes, which the model's chain rows leave out within their error).
HOST_S = 3.0e-3
# ... and in a round verifying a worker's tree, which it did not draft: 0.7 ms measured there (2026-11-26,
# the tiny-draft pair: verification 24.3 ms over the paced 23.6).
REMOTE_HOST_S = 0.7e-3
# From a verdict to a worker's first pass after it: the Round's way, the reply, re-rooting the tree (1.0
# to 1.3 ms measured on the paced test bed, 2026-11-26).
WORKER_SETTLE_S = 1.2e-3


@dataclass(frozen=True)
class TreeRound:
    """A tree round on average: tok/s, nodes verified, expected tokens and the share drafted here."""

    tok_s: float
    nodes: float
    tokens: float
    draft_s: float = 0.0  # the target machine's drafting a round (local tree SD)
    local_share: float = 1.0  # rounds whose tree the target machine drafted (a worker had none ready)
    miss: str = ""  # what such a round verifies: "ar" (the verdict's token alone) or "tree" (a local tree)


def tree_outcomes(profile: Profile) -> Outcomes:
    """The pair as a tree's verification takes it: a node is accepted where the target's token is its
    token, so the first choice's share is the pair's acceptance at T = 0, and at T > 0 the chance that
    the target's draw is the draft's first choice (the agreement's ``draw1``, where measured), not
    rejection sampling's acceptance."""
    alpha = profile.agreement.get("draw1", planned.acceptance(profile).profile[0])
    return Outcomes(
        alpha, {**profile.agreement, "top1": alpha} if "draw1" in profile.agreement else profile.agreement
    )


def best_size(chances: list[float], verify_s: Callable[[int], float], fixed_s: float = 0.0) -> int:
    """How many of ``chances`` (best first) give the most expected tokens a second, the rule every tree
    is sized by: (1 + their sum) / (``fixed_s`` + a verification over them and the last verified token)."""
    best, best_n, total = 0.0, 0, 1.0
    for n, c in enumerate(chances, start=1):
        total += c
        rate = total / (fixed_s + verify_s(n + 1))
        if rate > best:
            best, best_n = rate, n
    return best_n


def local_tree(profile: Profile, k_max: int, nodes: int = LOCAL_NODES, width: int = LOCAL_WIDTH) -> TreeRound:
    """Local tree SD on ``profile``'s target machine, at most ``k_max`` deep (module docstring)."""
    return _local(profile, k_max, nodes, width)[0]


def _local(
    profile: Profile, k_max: int, nodes: int = LOCAL_NODES, width: int = LOCAL_WIDTH
) -> tuple[TreeRound, list[tuple[int, ...]]]:
    """Local tree SD's round, and the nodes it verifies as paths of choice ranks (the same every round)."""
    if profile.local_draft is None:
        raise ValueError(f"profile {profile.name} gives the target machine no draft model")
    draft, target = profile.local_draft, planned.target(profile)
    share = rank_shares(tree_outcomes(profile))
    level: list[tuple[float, tuple[int, ...]]] = [(share[r], (r,)) for r in range(1, width + 1)]
    grown = list(level)
    draft_s = draft.pass_s(1)
    best: tuple[TreeRound, list[tuple[int, ...]]] = (TreeRound(0.0, 0, 0.0), [])
    for depth in range(1, k_max + 1):
        if depth > 1:
            scores = sorted((s for s, _ in grown), reverse=True)
            bar = scores[nodes - 1] if len(scores) >= nodes else 0.0
            expand = [n for n in sorted(level, reverse=True)[:width] if n[0] >= bar]
            if not expand:
                break
            draft_s += draft.pass_s(len(expand))
            level = [(s * share[r], (*path, r)) for s, path in expand for r in range(1, width + 1)]
            grown += level
        chosen = sorted(grown, key=lambda n: (-n[0], len(n[1])))[:nodes]
        n = best_size([s for s, _ in chosen], target.verify_s, draft_s + target.engine_s)
        tokens = 1 + sum(s for s, _ in chosen[:n])
        round_s = draft_s + target.engine_s + HOST_S + target.verify_s(n + 1)
        if tokens / round_s > best[0].tok_s:
            best = (TreeRound(tokens / round_s, n, tokens, draft_s), [path for _, path in chosen[:n]])
    return best


def remote_tree(
    profile: Profile,
    machines: list[Machine],
    k_max: int,
    rows: int,
    rounds: int,
    seed: int = 0,
    reply_nodes: int = REPLY_NODES,
    budget: int = DEFAULT_PASSES,
    width: int = TREE_VERIFY_WIDTH,
    miss: str | None = None,
) -> TreeRound:
    """``machines`` growing one tree, the target verifying what they have under each verdict (module
    docstring); a round they have nothing ready for verifies the verdict's token alone (``miss`` "ar")
    or a local tree ("tree"); None: as ``miss_shape`` says for the slowest of them."""
    if profile.local_draft is None:
        raise ValueError(f"profile {profile.name} gives the target machine no draft model")
    outcomes = tree_outcomes(profile)
    target = planned.target(profile)
    local, local_shape = _local(profile, k_max)
    fixed_s = target.engine_s + REMOTE_HOST_S + planned.link(profile).rtt_s + profile.stream_per_round_s
    workers = [Worker(m.draft.pass_s, rows) for m in machines if m.draft is not None]
    if miss is None:
        slowest = max(w.pass_s(rows) for w in workers)
        miss = miss_shape(slowest, miss_round_s(target.verify_s(1), profile.stream_per_round_s))
    rng = random.Random(seed)
    tree = RankTree(outcomes, width=width)
    clocks = [0.0] * len(workers)
    made = [0] * len(workers)  # passes since the last verdict
    passes: list[list[RankNode]] = [[] for _ in workers]
    now = tokens = nodes = 0.0
    misses = 0

    def run_until(t: float) -> None:
        """Every pass that ends by the verdict at ``t``: a worker starts none that would end later (it
        times its passes by the window), nor more than ``budget`` after a verdict; it starts again once
        it has heard the verdict and re-rooted its tree."""
        while True:
            i = min(range(len(workers)), key=lambda j: clocks[j])
            if clocks[i] > t:
                return
            tree.expand(passes[i])
            passes[i] = []
            rows = workers[i].rows
            if made[i] < budget and clocks[i] + workers[i].pass_s(rows) <= t:
                passes[i] = tree.take(rows)
            made[i] += 1
            if passes[i]:
                clocks[i] += workers[i].pass_s(len(passes[i]))
            else:
                clocks[i] = t + 1e-9  # idle until the verdict

    for _ in range(rounds):
        verified = _ready(tree.root, reply_nodes, k_max)
        if verified:
            n = best_size([v.probability for v in verified], target.verify_s, fixed_s)
            verified = verified[:n]
        elif miss == "ar":  # nothing ready: the verdict's token alone (the worker catches up meanwhile)
            misses += 1
            verified = []
        else:  # nothing ready: the target machine drafts its own tree
            misses += 1
            now += local.draft_s + HOST_S - REMOTE_HOST_S
            verified = [_at(tree.root, path, tree.shares) for path in local_shape]
        chosen = {id(v) for v in verified}
        now += fixed_s + target.verify_s(len(verified) + 1)
        run_until(now)
        clocks = [max(c, now + WORKER_SETTLE_S) for c in clocks]
        node, accepted = tree.root, 0
        while True:
            rank = target_rank(rng, tree.shares)
            child = node.children.get(rank) if rank <= width else None
            if child is None or id(child) not in chosen:
                break
            node, accepted = child, accepted + 1
        tree.advance(node.child(rank, tree.shares) if rank <= width else RankNode(0.0, node))
        made = [0] * len(workers)
        tokens += accepted + 1
        nodes += len(verified)
    return TreeRound(tokens / now, nodes / rounds, tokens / rounds, local_share=misses / rounds, miss=miss)


def tree_rows(points: Sequence[tuple[int, float]]) -> int:
    """The rows of a worker's tree pass in a tree-verifying set-up: of its measured passes ((rows,
    seconds), Hello's ``pass_curve``), the widest, up to ``MAX_BATCH``, within ``SAME_COST`` of its pass
    of ``TREE_ROWS`` rows; else ``TREE_ROWS``.

    A Mac's pass reads the draft's weights whatever its rows, until their compute takes longer, so a
    wider pass costs nothing until then and the tree grows as deep a window, and wider. On the paced
    test bed (2026-11-29, the 27B profile, the M1 Max: 11.5 ms a pass up to 35 rows) 32 rows made 1.27-
    1.29x local tree SD where 16 made 1.21-1.22x, with a miss in 12% of rounds instead of 15%; 64 rows,
    at 20.8 ms a pass, fit two passes a window instead of four and made 1.09x. On the 9B's (a window
    of two passes) 16 and 32 rows made the same, within a run's noise. A CPU's passes cost every row:
    ``TREE_ROWS``. Read from the measured points, not a fitted line: a line through a flat stretch and
    a rising one slopes all along.
    """
    base = measured_pass_s(non_decreasing(points), TREE_ROWS)
    wide = [r for r, s in points if TREE_ROWS <= r <= MAX_BATCH and s <= base * SAME_COST]
    return max(wide, default=TREE_ROWS)


def curve_tree_rows(curve: PassCurve) -> int:
    """``tree_rows`` for a machine known by its curve (a profile's, or one fitted to a worker's Hello):
    read at the rows a worker measures (``CURVE_ROWS``), as its Hello would give them."""
    return tree_rows([(rows, curve.pass_s(rows)) for rows in CURVE_ROWS])


def miss_round_s(verify_one_s: float, per_round_s: float) -> float:
    """A round verifying the verdict's token alone, as ``miss_shape`` weighs it, in the plan as in the
    coordinator (``drafting.factory``): a verification of one position, and the host's and the protocol's
    time a round. The link's own time is left out: a worker that fits only with it is taken not to."""
    return verify_one_s + REMOTE_HOST_S + per_round_s


def miss_shape(worker_pass_s: float, ar_round_s: float) -> str:
    """What a tree-verifying round verifies when the worker has nothing ready under the verdict.

    The verdict's token alone ("ar") when the worker makes two passes within such a round even after
    finishing the pass the verdict came in the middle of: the first expands the verdict, the second its
    children, among which the next verdict lands, so the worker is ready again a round later. A worker's
    passes are not in step with the verdicts (a host's latency moves each by more than the worker's
    clock allows for), so one is on average half done when the verdict comes, and the round must hold
    two and a half passes. Otherwise a tree drafted here ("tree"). On the paper's preset the M1 Max has
    2.4 ms to spare for two passes (11.55 ms each, a 26.7 ms round): on the test bed on 2026-11-26 the
    lone token made 72.05 tok/s against a local tree's 66.97, but on 2026-11-29 the same commit (c295e6a)
    found the worker ready in 36% of rounds and made 49.80 against local tree SD's 64.09, and in one run
    at 2af51df the lone token made 54.34 against a local tree's 61.70.
    """
    return "ar" if 2.5 * worker_pass_s + WORKER_SETTLE_S <= ar_round_s else "tree"


def _ready(root: RankNode, most: int, depth: int) -> list[RankNode]:
    """The nodes under ``root`` whose token is known (their parent expanded), best first, each after its
    parent, at most ``most`` of them and ``depth`` deep."""
    if not root.expanded:
        return []
    order = itertools.count()
    heap = [(-c.probability, next(order), c, 1) for c in root.children.values()]
    heapq.heapify(heap)
    out: list[RankNode] = []
    while heap and len(out) < most:
        _, _, node, level = heapq.heappop(heap)
        out.append(node)
        if node.expanded and level < depth:
            for c in node.children.values():
                heapq.heappush(heap, (-c.probability, next(order), c, level + 1))
    return out


def _at(root: RankNode, path: tuple[int, ...], share: list[float]) -> RankNode:
    """The node ``path`` (choice ranks) leads to from ``root``."""
    node = root
    for rank in path:
        node = node.child(rank, share)
    return node
