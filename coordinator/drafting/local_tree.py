"""Local tree SD: the coordinator's own draft model drafts a tree, and the target checks it in one pass.

Each round the draft model grows a tree after the verified context, one
batched pass per depth (tree attention, ``specwire.models.tree_pass``):

* the first pass feeds the context the draft has not seen (the target's last
  token, and any accepted drafts it never fed) and gives the likeliest
  ``width`` tokens after it;
* each later pass feeds the likeliest nodes of the deepest level (at most
  ``width``), so the next level holds their likeliest ``width`` children;
* a node's score is its path's probability under the draft; a node scoring
  below the ``nodes``-th best so far cannot lead to a node the tree keeps,
  so it is not expanded;
* a round drafts no deeper than pays: another pass is made only if, at
  best (its children carrying all of the expanded nodes' probability), it
  raises the expected tokens a second defined below.

The round then sends the target the nodes that maximise the expected tokens
a second (Sequoia's idea, with the draft's path probabilities as the chance
that a node is accepted): the best n nodes by score, n chosen so that
(1 + sum of their scores) / (drafting time + the target's verification time
over n + 1 positions) is largest. The target's time by positions is
``VerifyCurve``, measured once at start. Where n positions cost about n
passes (this project's CPU), n stays small; where a pass over 16 positions
costs about one (a Mac's GPU), the tree grows to ``nodes``.

After the verdict the draft's cache keeps the K/V of the accepted path's
nodes it fed (``keep_positions``) and drops the rest, so nothing is fed twice.
A draft with Gated DeltaNet layers (dense Qwen3.5) feeds each level with
every node continuing its parent's recurrent state, kept by node
(``specwire.models.node_pass``: the level's nodes as the rows of one
batch); the verdict puts the state of the accepted path's last fed node
back.
The tree does not depend on the target's draws, so verification walking it
with the target's own samples stays lossless at T > 0
(``coordinator.decoding.acceptance``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache, trim_prompt_cache

from coordinator.decoding.recurrent_pass import keeps_states
from coordinator.drafting.base import Outcome
from coordinator.planning.ahead.tree_verify import best_size
from specwire.drafting.choices import processed_choices, top_choices
from specwire.drafting.draft_block import DraftBlock
from specwire.drafting.drafter import prefill, prefill_cached
from specwire.drafting.prefix_cache import PrefixCache
from specwire.drafting.sampling import SamplingParams
from specwire.drafting.token_tree import TokenTree
from specwire.emulation.pace import hold_pass
from specwire.emulation.profile import SAME_COST
from specwire.errors import InvalidArgumentError, UnsupportedModelError
from specwire.logits.processors import Processing
from specwire.models.loading import LoadedModel
from specwire.models.node_pass import forward_nodes_keeping_states, stacked
from specwire.models.tree_pass import check_tree_support, forward_at, keep_positions

DEFAULT_NODES = 16
DEFAULT_WIDTH = 4
CURVE_POSITIONS = (1, 2, 4, 8, 16, 32)
CURVE_REPEATS = 3
KNEE_STEP = 4  # positions between points where the curve turns


@dataclass(frozen=True)
class VerifyCurve:
    """The target's time for one verification pass, by the positions it covers (measured points)."""

    positions: tuple[int, ...]
    seconds: tuple[float, ...]

    def at(self, positions: int) -> float:
        """Seconds for ``positions``: interpolated between measured points, linear past the last."""
        return _interpolated(self.positions, self.seconds, positions)

    def best_size(self, probs: Sequence[float], fixed_s: float = 0.0) -> int:
        """How many of the nodes (best first, with each one's chance of acceptance ``probs``) maximise
        expected tokens a second: (1 + their chances) / (``fixed_s`` + a verification over them and the
        last verified token)."""
        return best_size(list(probs), self.at, fixed_s)

    def __str__(self) -> str:
        return ", ".join(f"{p}: {s * 1e3:.2f} ms" for p, s in zip(self.positions, self.seconds, strict=True))


@functools.lru_cache(maxsize=4096)  # trees are sized every round, over the same few counts
def _interpolated(positions: tuple[int, ...], seconds: tuple[float, ...], n: int) -> float:
    if n > positions[-1]:
        return seconds[-1] * n / positions[-1]
    return float(np.interp(n, positions, seconds))


def measure_verify_curve(target: LoadedModel, context: int = 128) -> VerifyCurve:
    """The target's median pass time over each of ``CURVE_POSITIONS`` positions, after ``context`` cached,
    and where the curve turns from flat to rising, more points between (``_knee``)."""
    cache = make_prompt_cache(target.model)
    prefill(target.model, cache, [0] * context)
    measure = functools.partial(_pass_s, target, cache)
    points = {n: measure(n) for n in CURVE_POSITIONS}
    _knee(points, measure)
    return VerifyCurve(tuple(sorted(points)), tuple(points[n] for n in sorted(points)))


def _knee(points: dict[int, float], measure: Callable[[int], float]) -> None:
    """Add points where the curve turns from flat to rising, down to ``KNEE_STEP`` positions apart.

    A GPU's pass reads the weights whatever its positions, until the positions' compute takes longer
    (a paced 27B target: 52.2 ms up to 20 positions, then 2.6 ms a position; 82.5 ms at 32).
    Interpolated from 16 to 32, 20 positions read 59.8 ms, so the worker's trees were cut to 16 nodes
    where 20 cost no more. Between a point on the flat and the next, rising one, the curve is
    bisected; where it rises all along (a CPU's), nothing is added.
    """
    sizes = sorted(points)
    for before, lo, hi in zip(sizes, sizes[1:], sizes[2:], strict=False):
        if points[lo] > SAME_COST * points[before] or points[hi] <= SAME_COST * points[lo]:
            continue
        flat = points[lo]
        while hi - lo > KNEE_STEP:
            mid = (lo + hi) // 2
            points[mid] = measure(mid)
            lo, hi = (mid, hi) if points[mid] <= SAME_COST * flat else (lo, mid)


def _pass_s(target: LoadedModel, cache: list, positions: int) -> float:
    """The median of ``CURVE_REPEATS`` passes over ``positions`` positions, after one that warms it."""
    times = []
    for _ in range(CURVE_REPEATS + 1):
        started = time.perf_counter()
        mx.eval(target.model(mx.array([[0] * positions]), cache=cache))
        times.append(time.perf_counter() - started)
        trim_prompt_cache(cache, positions)
    return float(np.median(times[1:]))


@dataclass
class _Node:
    token: int
    parent: int  # an earlier node, or -1: right after the context
    score: float  # the path's probability under the draft
    depth: int


class LocalTreeDraftSource:
    """A tree-drafting source backed by a draft model in this process (module docstring)."""

    def __init__(
        self,
        draft: LoadedModel,
        curve: VerifyCurve | None = None,
        nodes: int = DEFAULT_NODES,
        width: int = DEFAULT_WIDTH,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.prefix_cache = prefix_cache  # the draft's prompt cache across generations (serve)
        if nodes < 1 or width < 1:
            raise InvalidArgumentError(f"a draft tree needs nodes and width of 1 or more: {nodes}, {width}")
        self.draft = draft
        self.curve = curve
        self.nodes = nodes
        self.width = width
        self.name = f"local-tree:{draft.spec}"
        self._cache: list | None = None
        self._context: list[int] = []
        self._nodes: list[_Node] = []
        self._fed: dict[int, int] = {}  # node -> its position in the draft's cache
        self._sent: TokenTree | None = None
        self._sent_index: list[int] = []  # the sent tree's node i is self._nodes[self._sent_index[i]]
        self._grown_at: int | None = None  # where the last tree's nodes begin in the cache (None: no tree)
        self._recurrent: list[int] = []  # the draft's recurrent layers (dense Qwen3.5: their states by node)
        self._attention: list = []  # its other layers' caches
        self._root: dict[int, tuple[mx.array, mx.array]] = {}  # recurrent states after the context
        self._states: dict[int, dict[int, tuple[mx.array, mx.array]]] = {}  # ... after each node fed
        self.sizes: list[int] = []  # nodes sent each round
        self.processing: Processing | None = None  # the request's penalties and grammar, on every node

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        """Prefill the prompt (all but its last token) into a fresh draft cache."""
        self._cache = make_prompt_cache(self.draft.model)
        self._recurrent = []
        try:
            check_tree_support(self.draft.model, self._cache)
        except UnsupportedModelError:
            if not keeps_states(self.draft.model, self._cache):
                raise
            self._recurrent = [i for i, layer in enumerate(self._cache) if not isinstance(layer, KVCache)]
        self._attention = [layer for i, layer in enumerate(self._cache) if i not in self._recurrent]
        fed = list(prompt[:-1])
        prefill_cached(self.draft.model, self._cache, fed, self.prefix_cache)
        self._context = list(prompt)
        self._nodes, self._fed, self._sent, self._grown_at = [], {}, None, None

    def use_processing(self, processing: Processing | None) -> None:
        """Draft the next generation under the request's penalties and grammar (before ``start``): each
        node's children chosen from its processed logits (its path the suffix), as the verdict will be."""
        self.processing = processing

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Apply the last verdict, then draft a tree at most ``k`` deep."""
        if outcome is not None:
            self.observe(outcome)
        return self.draft_tree(k)

    def draft_tree(self, k: int) -> DraftBlock:
        """Draft a tree at most ``k`` deep after the context as it stands."""
        if self._cache is None:
            raise InvalidArgumentError("propose() before start()")
        started = time.perf_counter_ns()
        passes = self._grow(k)
        tree = self._choose(time.perf_counter_ns() - started)
        self.sizes.append(len(tree))
        return DraftBlock(list(tree.tokens), None, passes, time.perf_counter_ns() - started, tree=tree)

    def keep_context(self) -> None:
        """Keep the draft's cache at the context so far in the prompt cache, so that a source taking over
        on the same draft model prefills only what follows (``drafting.auto``'s moves). A draft with
        recurrent layers keeps none: their states lie at the last tree's nodes."""
        if self.prefix_cache is None or self._cache is None or self._recurrent or not self._attention:
            return
        fed = self._grown_at if self._grown_at is not None else self._attention[0].offset
        self.prefix_cache.store(self._context[:fed], self._cache)

    def close(self) -> None:
        """Drop the draft cache."""
        self._cache = None

    def observe(self, outcome: Outcome) -> None:
        """Apply a verdict (whoever drafted the tree it verified): the context grows by its tokens, and
        the draft's cache keeps the nodes of this source's last tree that it accepted."""
        if self._cache is None:
            raise InvalidArgumentError("a verdict before start()")
        if outcome.accepted and not outcome.appended:
            raise InvalidArgumentError("a tree source needs the verdict's tokens (Outcome.appended)")
        appended = outcome.tokens([])
        if self._grown_at is not None:  # this source drafted the last round: keep what it accepted
            kept = []
            node, last = -1, -1
            for token in appended[:-1]:  # the accepted path; the draft fed some of its nodes
                child = self._sent.child(node, token) if self._sent is not None else None
                if child is None or self._sent_index[child] not in self._fed:
                    break
                last = self._sent_index[child]
                kept.append(self._fed[last])
                node = child
            keep_positions(self._attention, self._grown_at, kept)
            for i, state in self._states.get(last, self._root).items():  # recurrent layers: the path's
                self._cache[i][0], self._cache[i][1] = state
        self._grown_at = None
        self._context.extend(appended)

    def _grow(self, k: int) -> int:
        """Grow this round's candidate nodes, at most ``k`` deep; returns the passes it took."""
        assert self._cache is not None
        model = self.draft.model
        self._nodes, self._fed = [], {}
        context = len(self._context)
        unseen = self._context[self._attention[0].offset :]
        started = time.perf_counter()
        rows = model(mx.array([unseen]), cache=self._cache)[0, -1:]
        self._root = {i: (self._cache[i][0], self._cache[i][1]) for i in self._recurrent}
        self._states = {}
        self._grown_at = context  # this round's nodes are fed after the context
        self._add_children([-1], rows)
        pass_s = time.perf_counter() - started
        passes = 1
        level = [i for i, node in enumerate(self._nodes) if node.depth == 1]
        for depth in range(2, k + 1):
            bar = self._bar()
            expand = sorted(level, key=lambda i: -self._nodes[i].score)[: self.width]
            expand = [i for i in expand if self._nodes[i].score >= bar]
            if not expand or not self._pays(expand, time.perf_counter() - started, pass_s):
                break
            before = time.perf_counter()
            cached = self._attention[0].offset
            visible = np.zeros((len(expand), cached + len(expand)), dtype=bool)
            visible[:, :context] = True
            for row, i in enumerate(expand):
                visible[row, cached + row] = True
                for above in self._line(i)[:-1]:
                    visible[row, self._fed[above]] = True
                self._fed[i] = cached + row
            rows = self._level(expand, [context + depth - 2] * len(expand), visible)
            passes += 1
            first = len(self._nodes)
            self._add_children(expand, rows)
            pass_s = time.perf_counter() - before
            level = list(range(first, len(self._nodes)))
        return passes

    def _level(self, expand: list[int], positions: list[int], visible: np.ndarray) -> mx.array:
        """One pass feeding ``expand``'s nodes: their next-token logits [n, vocab]. A recurrent layer
        takes each node from its parent's state (the context's for a first-level node) and keeps its
        own for its children and the verdict."""
        assert self._cache is not None
        tokens = [self._nodes[i].token for i in expand]
        if not self._recurrent:
            return forward_at(self.draft.model, self._cache, tokens, positions, visible)[0]
        parents = [self._states.get(self._nodes[i].parent, self._root) for i in expand]
        starts = {j: stacked([p[j] for p in parents]) for j in self._recurrent}
        started = time.perf_counter()
        logits, after = forward_nodes_keeping_states(
            self.draft.model, self._cache, tokens, positions, visible, starts
        )
        hold_pass(self.draft.model, started, len(tokens), logits, list(after.values()))
        for row, i in enumerate(expand):
            self._states[i] = {j: (w[row : row + 1], s[row : row + 1]) for j, (w, s) in after.items()}
        return logits[0]

    def _pays(self, expand: list[int], elapsed_s: float, pass_s: float) -> bool:
        """Whether one more pass, expanding ``expand``, may raise the expected tokens a second.

        At best it adds the whole probability of the nodes it expands (their
        children's, shared among them) for one node each, after one more pass
        as long as the last one.
        """
        if self.curve is None:
            return True
        scores = np.sort([node.score for node in self._nodes])[::-1][: self.nodes]
        sizes = np.arange(1, len(scores) + 1)
        verify = np.array([self.curve.at(n + 1) for n in sizes])
        now = np.max((1 + np.cumsum(scores)) / (elapsed_s + verify))
        gain = sum(self._nodes[i].score for i in expand)
        verify_more = np.array([self.curve.at(n + 1 + len(expand)) for n in sizes])
        best = np.max((1 + np.cumsum(scores) + gain) / (elapsed_s + pass_s + verify_more))
        return bool(best > now)

    def _add_children(self, parents: list[int], rows: mx.array) -> None:
        if self.processing is not None:
            paths = [[self._nodes[n].token for n in self._line(parent)] for parent in parents]
            ids, probs = processed_choices(rows, paths, self.processing, self.width)
        else:
            lazy = top_choices(rows, self.width)
            mx.eval(*lazy)
            ids, probs = np.array(lazy[0]).tolist(), np.array(lazy[1]).tolist()
        for parent, tokens, ps in zip(parents, ids, probs, strict=True):
            base = self._nodes[parent].score if parent >= 0 else 1.0
            depth = self._nodes[parent].depth + 1 if parent >= 0 else 1
            for token, p in zip(tokens, ps, strict=True):
                self._nodes.append(_Node(int(token), parent, base * float(p), depth))

    def _line(self, node: int) -> list[int]:
        """The nodes from the context down to ``node``, ``node`` last (none for -1, the context itself)."""
        line = []
        while node >= 0:
            line.append(node)
            node = self._nodes[node].parent
        return line[::-1]

    def _bar(self) -> float:
        """The ``nodes``-th best score so far: nothing below it can make the tree."""
        scores = sorted((node.score for node in self._nodes), reverse=True)
        return scores[self.nodes - 1] if len(scores) >= self.nodes else 0.0

    def _choose(self, draft_ns: int) -> TokenTree:
        """The best nodes by score, as many as maximise the expected tokens a second."""
        order = sorted(range(len(self._nodes)), key=lambda i: (-self._nodes[i].score, self._nodes[i].depth))
        order = order[: self.nodes]
        size = len(order)
        if self.curve is not None:
            size = self.curve.best_size([self._nodes[i].score for i in order], draft_ns / 1e9)
        chosen = sorted(order[:size], key=lambda i: (self._nodes[i].depth, i))  # a parent before its children
        at = {node: n for n, node in enumerate(chosen)}
        parents = []
        for i in chosen:
            parent = self._nodes[i].parent
            parents.append(at[parent] if parent >= 0 else -1)
        self._sent = TokenTree(tuple(self._nodes[i].token for i in chosen), tuple(parents))
        self._sent_index = chosen
        return self._sent
