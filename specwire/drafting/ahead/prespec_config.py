"""How much a worker pre-speculates (``PrespecConfig``) and the bounds a session may ask for.

Kept apart from ``specwire.drafting.ahead.speculation`` (which drafts by it) so that a worker's flags read
these defaults without loading mlx-lm.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwire.errors import InvalidArgumentError

DEFAULT_FANOUT = 2
MAX_FANOUT = 32
MAX_BUDGET = 256  # forward passes per round: a session cannot keep the worker busy for long
MAX_BATCH = 64  # branches in one pass
# A tree's rows a pass when a session does not ask for a number: the most that held the M1 Max's pace on
# the 2-core test bed (24 overran). A Mac's GPU takes up to 35 at one row's cost, but the host's work per
# pass grows with the rows.
TREE_ROWS = 16
# The tree passes a worker times at start (Hello's pass curve), up to the widest a coordinator may ask for:
# past the last size measured, a pass was taken to grow in proportion, which a Mac's bandwidth-bound passes
# do not (a paced M1 Max: 11.5 ms at 16 and 32 rows, not 23 at 32), so a worker asked for 32 rows
# mistimed its passes.
CURVE_ROWS = (1, 2, 4, 8, 16, 32, MAX_BATCH)
# What a worker's trees may hold together, each node's K/V position and (a hybrid draft's) recurrent states:
# sized for a 32 GB Mac serving Qwen3.5-0.8B (1.6 GB in bfloat16), a quarter of its memory;
# docs/measurements.md ("A hybrid worker's tree: memory") gives that model's bytes a node.
TREE_MEMORY = 8 << 30


@dataclass(frozen=True)
class PrespecConfig:
    """How much to pre-speculate: forward passes per round, candidates per position, and how to rank."""

    budget: int = 0  # 0: enough for the bonus probe and two branches (2k + 1)
    fanout: int = DEFAULT_FANOUT
    batch: int = 1  # branches drafted side by side in one forward pass (specwire.drafting.ahead.branch_batch)
    fill: bool = False  # answer with the drafts ready at once; the coordinator drafts the rest itself
    tree: bool = (
        False  # fill at T = 0: one tree of continuations across rounds (specwire.drafting.ahead.draft_tree)
    )
    tree_rows: int = TREE_ROWS  # a worker's default batch for a tree session
    tree_memory: int = TREE_MEMORY  # bytes a worker's trees hold together (0: no limit; ``TreeMemory``)

    def __post_init__(self) -> None:
        if not 0 <= self.budget <= MAX_BUDGET:
            raise InvalidArgumentError(
                f"pre-speculation budget must be within 0..{MAX_BUDGET} passes, got {self.budget}"
            )
        if not 1 <= self.fanout <= MAX_FANOUT:
            raise InvalidArgumentError(f"pre-speculation fan-out must be within 1..{MAX_FANOUT}")
        if not 1 <= self.batch <= MAX_BATCH:
            raise InvalidArgumentError(f"pre-speculation batch must be within 1..{MAX_BATCH} branches")
        if not 1 <= self.tree_rows <= MAX_BATCH:
            raise InvalidArgumentError(f"tree rows a pass must be within 1..{MAX_BATCH}")
        if self.tree_memory < 0:
            raise InvalidArgumentError("tree memory must be 0 (no limit) or more bytes")
        if self.tree and not self.fill:
            raise InvalidArgumentError("tree pre-speculation answers in fill mode: it needs fill")

    def passes(self, k: int) -> int:
        """The budget for a round of ``k`` drafts."""
        return self.budget or 2 * k + 1

    @property
    def alternatives(self) -> int:
        """Candidates each drafted position keeps (the draft and ``fanout`` others), to plan from."""
        return self.fanout + 1
