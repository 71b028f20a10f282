"""A round's drafts as a draft source hands them to the engine, with what producing them cost."""

from __future__ import annotations

from dataclasses import dataclass, field

from specwire.drafting.sampling import SparseDistribution
from specwire.drafting.token_tree import TokenTree
from specwire.wire.timing import CallRecord


@dataclass
class DraftBlock:
    """k drafted tokens, the sparse q of each when sampling, and what producing them cost.

    ``calls`` holds one record per remote call that brought the drafts (empty
    when drafting locally). ``speculation`` says how a pre-speculating worker
    served them ("hit", "partial", "miss"; empty without pre-speculation),
    and ``saved_ns`` how much of their compute ran ahead, off the critical path.
    A block may be a tree (``tree``): ``tokens`` are then its nodes, the
    target checks every path in one pass, and ``dists`` is not used.
    """

    tokens: list[int]
    dists: list[SparseDistribution] | None
    forward_passes: int
    compute_ns: int
    calls: list[CallRecord] = field(default_factory=list)
    speculation: str = ""
    saved_ns: int = 0
    filled: int = 0  # the last drafts, made on this machine after a worker answered with fewer
    tree: TokenTree | None = None
    tree_probs: list[float] = field(default_factory=list)  # each node's estimated chance of acceptance
    trimmed: int = 0  # a worker's tree nodes left out of verification (they did not pay)
