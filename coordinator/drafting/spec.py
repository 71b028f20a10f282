"""What to draft with: ``DraftSpec`` (as ``--draft`` and its flags name it), checked whole, and the
``PreSpeculation`` a remote mode opens its session with. ``DraftSources``
(``coordinator.drafting.factory``) opens it.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.drafting.failover import POLICIES
from coordinator.drafting.ggml_rpc.model import GRANULARITIES
from coordinator.planning.ahead.tree_verify import TREE_VERIFY_WIDTH
from coordinator.planning.setups import FILL_FANOUT, REMOTE_MODES
from specwire.errors import InvalidArgumentError
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import BACKEND_PER_OP, BACKEND_STREAM

KINDS = ("none", "local", "local-tree", "remote", "auto")
TREE_VERIFY = "tree-verify"  # the worker's tree is sent as a tree, and the target verifies it in one pass
MODES = (*REMOTE_MODES, TREE_VERIFY)
FILLED = ("tree", TREE_VERIFY)  # the remote modes whose short answers the local draft model finishes


@dataclass(frozen=True)
class DraftSpec:
    """What to draft with.

    ``kind``: ``none`` (autoregressive), ``local`` (the ``local`` draft model
    here), ``local-tree`` (the same model drafting a tree,
    ``coordinator.drafting.local_tree``), ``remote`` (a worker, in ``mode``: ``stream`` or ``tree``; or over
    the per-op ``backend``), or ``auto`` (the drafting
    policy, ``coordinator.drafting.auto``, which chooses among all of them).
    ``workers`` selects workers: Bonjour names or HOST:PORT; empty means
    every compatible worker discovered (``remote``: the fastest of them).
    ``local`` is the local draft model: local SD's, the one trees draft the
    rest on, and the one ``on_loss`` ``local`` falls back to. ``rows``: nodes
    a worker expands side by side in a pass of a tree (0: the worker's
    ``--tree-rows``).
    """

    kind: str = "none"
    local: str = ""
    workers: tuple[str, ...] = ()
    mode: str = "stream"
    backend: str = BACKEND_STREAM
    granularity: str = "op"
    rows: int = 0
    on_loss: str = "failover"

    @classmethod
    def parse(cls, text: str, local: str = "", **remote: object) -> DraftSpec:
        """The spec a ``--draft`` value names: ``auto``, ``none``, ``local[:SPEC]`` or ``remote[:MODE]``."""
        kind, _, rest = text.partition(":")
        if text in ("none", "auto"):
            return cls(text, local=local, **(remote if text == "auto" else {})).checked()  # type: ignore[arg-type]
        if kind in ("local", "local-tree"):
            return cls(kind, local=rest or local).checked()
        if kind == "remote":
            return cls("remote", local=local, mode=rest or "stream", **remote).checked()  # type: ignore[arg-type]
        raise InvalidArgumentError(
            f"--draft {text!r}: expected auto, local[:SPEC], local-tree[:SPEC], remote[:MODE] "
            f"(MODE: {', '.join(MODES)}) or none"
        )

    def checked(self) -> DraftSpec:
        """This spec, or ``InvalidArgumentError`` naming what does not fit together."""
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"draft kind {self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.kind in ("local", "local-tree") and not self.local:
            raise InvalidArgumentError(
                f"--draft {self.kind} needs a draft model: {self.kind}:SPEC or --local-draft SPEC"
            )
        if self.backend not in (BACKEND_STREAM, BACKEND_PER_OP):
            raise InvalidArgumentError(
                f"backend {self.backend!r}: expected {BACKEND_STREAM} or {BACKEND_PER_OP}"
            )
        if self.granularity not in GRANULARITIES:
            raise InvalidArgumentError(
                f"granularity {self.granularity!r}: expected one of {', '.join(GRANULARITIES)}"
            )
        if self.mode not in MODES:
            raise InvalidArgumentError(f"remote mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if self.mode != "stream" and self.backend != BACKEND_STREAM:
            raise InvalidArgumentError(
                f"remote:{self.mode} is a mode of the stream backend, not {self.backend}"
            )
        if self.mode in FILLED and not self.local:
            raise InvalidArgumentError(f"remote:{self.mode} drafts what the worker has not on --local-draft")
        if self.kind == "remote" and len(self.workers) > 1:
            raise InvalidArgumentError(
                "--draft remote drafts on one worker; with several, --draft auto picks the fastest"
            )
        if self.on_loss not in POLICIES:
            raise InvalidArgumentError(
                f"--on-worker-loss {self.on_loss!r}: expected one of {', '.join(POLICIES)}"
            )
        return self

    @property
    def prespec(self) -> pb.PreSpeculation | None:
        """The PreSpeculation message a remote session opens with (None: drafting on demand)."""
        return prespec_for(self.mode, self.rows)


def prespec_for(mode: str, rows: int = 0) -> pb.PreSpeculation | None:
    """A remote mode's PreSpeculation: a ``tree`` drafts the worker's tree rows a pass (``rows`` > 0:
    this many), four choices kept of each node it expands (``planning.setups``); a tree verified whole
    keeps eight (``planning.ahead.tree_verify``): a verdict off the tree's chosen nodes then still lands on
    a node the worker expanded (on the paced test bed, 72.05 tok/s against 69.20 with four)."""
    if mode == "stream":
        return None
    fanout = TREE_VERIFY_WIDTH - 1 if mode == TREE_VERIFY else FILL_FANOUT
    return pb.PreSpeculation(enabled=True, fill=True, tree=True, batch=rows, fanout=fanout)
