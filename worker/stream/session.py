"""One generation session on a worker: its drafter, its checks and its counters.

The stream service calls ``open_session`` with the session's Open message and
then ``round`` once per Round message. Both validate their input against the
model (vocabulary, context length, k) before touching the KV cache, so a bad
message never leaves a session half-updated. Methods that run the model must
run on the worker's compute thread (``specwire.process.compute``).

With pre-speculation on, the session also owns a ``Speculator``: after each
reply the stream service runs its passes one at a time, and the next Round is
served from a finished branch (``serve_hit``, no compute), finishes a branch
under way, or is drafted on demand (``round``).

In fill mode (``PreSpeculation.fill``) the coordinator drafts on its own
draft model whatever the worker has not drafted ahead: each Round is answered
at once with the drafts ready for its verdict (``answer_ready``, possibly
none), the verdict is applied once the pass in flight has ended
(``settle_ready``), and the rest of the block is drafted afterwards, the
first of the background passes, because the next round's branches are
planned from it. With ``PreSpeculation.tree`` (T = 0) the session keeps one tree
of continuations across rounds instead (``specwire.drafting.ahead.draft_tree``): a Round is
answered with the chain of first choices after its verdict, and the verdict
re-roots the tree, keeping what was drafted for later rounds.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from specwire.drafting.ahead.draft_tree import DraftTree, TreeMemory
from specwire.drafting.ahead.prespec_config import PrespecConfig
from specwire.drafting.ahead.speculation import Speculator
from specwire.drafting.drafter import DraftBlock, Drafter, Drafting
from specwire.drafting.prefix_cache import PrefixCache
from specwire.drafting.token_tree import TokenTree
from specwire.emulation.pace import Pacer, buckets_of
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.processing import processing_from_pb
from specwire.wire.protocol import MAX_TREE_NODES, sampling_from_pb
from worker.server.hosting import WorkerCounters
from worker.stream.checks import check_open, check_round, check_tree, prespec_config
from worker.stream.computed import Computed, Ready
from worker.stream.window import VerdictClock

F = TypeVar("F", bound=Callable[..., Any])


def _tallied(method: F) -> F:
    """Add the paced passes (and overruns) of one compute job to the session's own counts.

    All MLX work of the worker runs one job at a time, so what the pacer
    counted during the job is this session's.
    """

    @functools.wraps(method)
    def wrapper(self: DraftSession, *args: Any, **kwargs: Any) -> Any:
        if self.pacer is None:
            return method(self, *args, **kwargs)
        before = self.pacer.snapshot()
        try:
            return method(self, *args, **kwargs)
        finally:
            done = self.pacer.snapshot().since(before)
            self.paced_passes += done.passes
            self.pace_overruns += done.overruns
            self.pace_buckets += buckets_of(done.headroom)

    return wrapper  # type: ignore[return-value]


class DraftSession:
    """A draft model's state for one coordinator's generation."""

    def __init__(
        self,
        model: LoadedModel,
        open_msg: pb.Open,
        totals: WorkerCounters,
        prespec_defaults: PrespecConfig | None = None,
        pacer: Pacer | None = None,
        memory: TreeMemory | None = None,
        pass_curve: Sequence[tuple[int, float]] = (),
        prompt_cache: PrefixCache | None = None,
    ) -> None:
        check_open(model, open_msg)
        self.prompt_cache = prompt_cache if open_msg.cache_key else None
        self.cache_key = open_msg.cache_key
        self.model = model
        self.totals = totals
        self.pacer = pacer
        self.paced_passes = 0
        self.pace_overruns = 0
        self.pace_buckets: list[int] = []  # headroom buckets of the paced passes not yet reported
        self.k = open_msg.k
        self.prompt = list(open_msg.prompt_tokens)
        self.drafter = Drafter(model.model, sampling_from_pb(open_msg.sampling))
        if open_msg.HasField("processing"):  # drafts chosen as the target's verdict will process them
            self.drafter.processing = processing_from_pb(open_msg.processing, model, self.prompt)
        config = prespec_config(open_msg.prespec, prespec_defaults or PrespecConfig())
        self.tree = None
        if config is not None and config.tree:
            check_tree(self.drafter)
            self.tree = DraftTree(self.drafter, config, model.context_length, memory)
            self.tree.set_curve(pass_curve)  # the worker's (rows, seconds): a pass sized to the window
        self.speculator = Speculator(self.drafter, config) if config is not None and not config.tree else None
        self.next_seq = 0
        self.rounds = 0
        self.draft_tokens = 0
        self.hits = 0
        self.partial = 0
        self.misses = 0
        self.speculative_passes = 0
        self._sent: Drafting | None = None
        self._passes_counted = 0
        self.fill = config is not None and config.fill
        self._alternatives = config.alternatives if config is not None else 0  # candidates kept a draft
        self._sent_k = self.k  # drafts the coordinator verified last round (fill: some its own)
        self._pending: Drafting | None = None  # fill: the block being finished in the background
        self._pending_k = 0
        self._reply_tree: tuple[list[int], list[int]] = ([], [])  # the last tree answered: tokens, parents
        self.clock = VerdictClock()  # when the verdict is expected: tree passes are timed by it
        self._verifying = False  # whether the latest reply's Verifying came
        self._verified: tuple[list[int], list[int]] | None = None  # nodes the coordinator added, to add here

    @property
    def speculates(self) -> bool:
        """Whether the session drafts ahead after each reply (``speculate``)."""
        return self.speculator is not None or self.tree is not None

    def take_pace_buckets(self) -> list[int]:
        """The headroom buckets of the paced passes since the last call (each reply reports its own)."""
        taken, self.pace_buckets = self.pace_buckets, []
        return taken

    def speculation_state(self) -> tuple[int, int]:
        """Speculative passes since the last plan, and the branches (tree: frontier nodes) it holds."""
        if self.tree is not None:
            return self.tree.passes, self.tree.frontier
        assert self.speculator is not None
        return self.speculator.passes, len(self.speculator.branches)

    @property
    def forward_passes(self) -> int:
        """Draft-model forward passes of this session, prefill included."""
        return self.drafter.forward_passes

    @_tallied
    def prefill(self) -> int:
        """Prefill the prompt; returns compute ns. Compute thread only."""
        elapsed = self.drafter.start(self.prompt, self.prompt_cache, self.cache_key)
        self._count_passes()
        return elapsed

    @_tallied
    def first_drafts(self) -> Computed:
        """Draft round 0 (the k of the Open message). Compute thread only."""
        started = time.perf_counter_ns()
        block = self._draft_on_demand(self.k)
        if self.tree is not None:
            assert self._sent is not None
            self.tree.plant(self._sent.tokens, self._sent.candidates)
        return Computed(self._count(block), started, time.perf_counter_ns())

    def check_round(self, msg: pb.Round) -> None:
        """Raise ``InvalidArgumentError`` unless ``msg`` is the next valid round."""
        check_round(
            self.model,
            msg,
            next_seq=self.next_seq,
            fill=self.fill,
            tree=self.tree is not None,
            greedy=self.drafter.params.greedy,
            drafted=self._drafted,
            context=len(self.drafter.context),
        )

    def serve_hit(self, msg: pb.Round) -> Computed | None:
        """Serve ``msg`` from a finished branch, with no compute; None when there is none.

        Runs on the event loop, possibly while a speculative pass is in
        flight: it reads only the branch (whose first k drafts are final)
        and updates only the accepted context.
        """
        self.check_round(msg)
        if self.speculator is None:
            return None
        branch = self.speculator.find(msg.accepted, msg.token, list(msg.appended))
        if branch is None or len(branch.tokens) < msg.k:  # a pass in flight may add more
            return None
        now = time.perf_counter_ns()
        self._verdict(msg)
        block = self.drafter.adopt(branch, msg.k)
        self.hits += 1
        self.totals.prespec_hits += 1
        self._sent = branch
        return Computed(self._count(block), now, now, pb.SPECULATION_HIT, block.compute_ns)

    def answer_ready(self, msg: pb.Round) -> Ready:
        """Fill mode: the drafts ready for ``msg``'s verdict, at once and without compute (maybe none).

        Runs on the event loop, possibly while a speculative pass is in
        flight: it only reads (the branch's tokens so far are final) and
        counts; ``settle_ready`` applies the verdict once that pass has ended.
        """
        self.check_round(msg)
        branch = None
        self._reply_tree = ([], [])
        if self.tree is not None and msg.tree_nodes:
            tokens, parents, probs, spent = self.tree.ready_tree(msg.appended, msg.tree_nodes, msg.k)
            tree = TokenTree(tuple(tokens), tuple(parents)) if tokens else None
            block = DraftBlock(tokens, None, 0, spent, tree=tree, tree_probs=probs)
            ready = tree.depth if tree is not None else 0
            self._reply_tree = (tokens, parents)
            # An entry for the verdict is verified as it is, nothing drafted on the critical path: a hit.
            outcome = self._tally(1 if tokens else 0, 1)
        elif self.tree is not None:
            drafts, spent = self.tree.ready(msg.appended, msg.k)
            block = DraftBlock(drafts, None, 0, spent)
            ready = len(block.tokens)
            outcome = self._tally(ready, msg.k)
        else:
            assert self.speculator is not None
            branch = self.speculator.find(msg.accepted, msg.token, list(msg.appended))
            ready = min(msg.k, len(branch.tokens)) if branch is not None else 0
            block = branch.block(ready) if branch is not None else DraftBlock([], None, 0, 0)
            outcome = self._tally(ready, msg.k)
        now = time.perf_counter_ns()
        computed = Computed(self._count(block), now, now, outcome, block.compute_ns)
        return Ready(msg, computed, branch, ready)

    def note_round(self, arrived_ns: int) -> None:
        """A Round came off the stream at ``arrived_ns``: the verdict the clock waited for."""
        self.clock.verdict(arrived_ns)
        self._verified = None

    def verifying(self, msg: pb.Verifying) -> None:
        """The target verifies ``msg``'s tree (the reply's first nodes, then the coordinator's): the
        tree's passes are timed to end by its verdict, and the coordinator's nodes join the tree at its
        next pass. ``InvalidArgumentError`` for a tree this session did not send. Event loop."""
        if self.tree is None or not self.fill:
            raise InvalidArgumentError("Verifying needs a session that drafts a tree and fills")
        where = f"Verifying of round {msg.seq}"
        if msg.seq != self.next_seq - 1:
            raise InvalidArgumentError(f"{where}; the latest answered is {self.next_seq - 1}")
        if self._verifying:
            raise InvalidArgumentError(f"a second {where}")
        tokens, parents = self._reply_tree
        if msg.reply_nodes > len(tokens):
            raise InvalidArgumentError(
                f"{where}: {msg.reply_nodes} of the reply's nodes; it had {len(tokens)}"
            )
        n = msg.reply_nodes
        try:
            verified = TokenTree((*tokens[:n], *msg.tokens), (*parents[:n], *msg.parents))
            verified.check(self.model.vocab_size, MAX_TREE_NODES, MAX_TREE_NODES)
        except InvalidArgumentError as err:
            raise InvalidArgumentError(f"{where}: {err}") from err
        self._verifying = True
        self.clock.verifying(msg.started_after_ns)
        if msg.tokens:
            self._verified = (list(verified.tokens), list(verified.parents))

    def _rows_that_fit(self) -> int:
        """How many rows a tree pass started now may take to end by the expected verdict (0: no pass)."""
        assert self.tree is not None
        deadline = self.clock.deadline()
        if deadline is None:
            return self.tree.rows
        return self.tree.rows_within(deadline - time.perf_counter())

    def pass_ends_within(self, seconds: float) -> bool:
        """Whether a tree pass is under way and expected to end within ``seconds``. Event loop."""
        ends = self.tree.pass_ends if self.tree is not None else None
        return ends is not None and ends - time.perf_counter() <= seconds

    def _tally(self, ready: int, k: int) -> int:
        """Count a fill-mode answer as a hit (all k ready), partial (some) or miss (none)."""
        t = self.totals
        if ready >= k:
            self.hits, t.prespec_hits = self.hits + 1, t.prespec_hits + 1
            return pb.SPECULATION_HIT
        if ready:
            self.partial, t.prespec_partial = self.partial + 1, t.prespec_partial + 1
            return pb.SPECULATION_PARTIAL
        self.misses, t.prespec_misses = self.misses + 1, t.prespec_misses + 1
        return pb.SPECULATION_MISS

    @_tallied
    def settle_ready(self, answer: Ready) -> None:
        """Fill mode: apply the verdict answered by ``answer_ready``; the block's rest is drafted next.

        Compute thread only, with no speculative pass in flight.
        """
        msg = answer.msg
        self._verdict(msg)
        if self.tree is not None:
            self.tree.advance(list(msg.appended))
            self.drafter.last_drafts, self._sent_k = list(answer.computed.block.tokens), msg.k
            return
        block = answer.block
        if block is None:
            block = self.drafter.drafting(msg.k, self._alternatives)
        block.k = max(block.k, msg.k)
        self.drafter.adopt(block, answer.ready)
        self._sent, self._sent_k = block, msg.k
        self._pending, self._pending_k = (block, msg.k) if answer.ready < msg.k else (None, 0)

    @_tallied
    def round(self, msg: pb.Round) -> Computed:
        """Apply the target's verdict, then draft the next k tokens. Compute thread only.

        With pre-speculation, a branch begun ahead for this verdict is
        finished rather than started over; speculation must be stopped first.
        """
        started = time.perf_counter_ns()
        self.check_round(msg)
        appended = list(msg.appended)
        branch = self.speculator.find(msg.accepted, msg.token, appended) if self.speculator else None
        self._verdict(msg)
        if branch is None:
            block = self._draft_on_demand(msg.k)
            outcome, saved = (pb.SPECULATION_MISS if self.speculator else pb.SPECULATION_OFF), 0
            self.misses += self.speculator is not None
            self.totals.prespec_misses += self.speculator is not None
        else:
            saved = branch.compute_ns
            branch.k = max(branch.k, msg.k)
            branch.advance(msg.k - len(branch.tokens))
            block = self.drafter.adopt(branch, msg.k)
            self._sent = branch
            outcome = pb.SPECULATION_PARTIAL
            self.partial += 1
            self.totals.prespec_partial += 1
        return Computed(self._count(block), started, time.perf_counter_ns(), outcome, saved)

    @_tallied
    def speculate(self) -> bool:
        """One speculative forward pass for the next round; False when there is nothing to do.

        Compute thread only.
        """
        if self.tree is not None:
            verified, self._verified = self._verified, None  # set on the event loop
            if verified is not None:
                self.tree.add_known(*verified)
            rows = self._rows_that_fit()
            if not rows or not self.tree.step(rows):
                return False
        elif self.speculator is None:
            return False
        elif self._pending is not None:
            self._finish_pending()
        elif not self.speculator.step():
            return False
        self._count_speculative_pass()
        return True

    def plan_speculation(self) -> None:
        """Rank the outcomes of the drafts just sent; call after each reply, before ``speculate``.

        In fill mode a block still being finished is planned from once it is done.
        """
        if self.speculator is not None and self._sent is not None and self._pending is None:
            self.speculator.plan(self._sent)

    def _finish_pending(self) -> None:
        """Fill mode: one more pass of the block the coordinator finished itself; plan once it is done."""
        block = self._pending
        assert block is not None and self.speculator is not None
        block.advance(1)
        if len(block.tokens) >= self._pending_k:
            self.drafter.last_drafts = block.tokens[: self._pending_k]
            self._pending = None
            self.speculator.plan(block)

    @property
    def _drafted(self) -> int:
        """Drafts verified in the last round: the worker's own, or in fill mode the round's k."""
        return self._sent_k if self.fill else len(self.drafter.last_drafts)

    def _verdict(self, msg: pb.Round) -> None:
        if msg.catch_up:  # tokens decoded without this session: nothing to learn of its drafts
            pass
        elif self.tree is not None:
            self.tree.observe(list(msg.appended))
        elif self.speculator is not None:
            self.speculator.rate.observe(msg.accepted, self._drafted)
        appended = self.drafter.apply(msg.accepted, msg.token, list(msg.appended))
        if self.drafter.processing is not None:
            self.drafter.processing.accept(appended)

    def _draft_on_demand(self, k: int) -> DraftBlock:
        drafting = self.drafter.drafting(k, self._alternatives)
        drafting.advance()
        self._sent = drafting
        return self.drafter.adopt(drafting)

    def _count_speculative_pass(self) -> None:
        """One speculative pass done: the session's and the worker's counts, and its forward passes."""
        self.speculative_passes += 1
        self.totals.speculative_passes += 1
        self._count_passes()

    def _count_passes(self) -> None:
        """Add the drafter's new forward passes to the worker's total."""
        passes = self.drafter.forward_passes
        self.totals.forward_passes += passes - self._passes_counted
        self._passes_counted = passes

    def _count(self, block: DraftBlock) -> DraftBlock:
        self._count_passes()
        self.next_seq += 1
        self._verifying = False  # this reply's Verifying may come
        self.rounds += 1
        self.draft_tokens += len(block.tokens)
        self.totals.draft_tokens += len(block.tokens)
        return block
