"""Command-line flags shared by the commands, and what they turn into.

Each ``add_*`` function adds one group of flags; the functions below them
turn parsed flags into the objects the rest of the coordinator takes
(``Credentials``, ``WorkerAccess``, ``DraftSpec``, ``FallbackSettings``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from coordinator.decoding.fallback import FallbackSettings
from coordinator.decoding.rollback import STRATEGIES
from coordinator.drafting.factory import DEFAULT_DISCOVER_TIMEOUT_S, DraftSpec, WorkerAccess
from coordinator.drafting.failover import POLICIES
from coordinator.drafting.ggml_rpc.model import GRANULARITIES
from coordinator.drafting.multi import DEFAULT_MODE, MODES
from coordinator.drafting.stream import ROUND_TIMEOUT_S
from coordinator.pacing import CoordinatorPace
from coordinator.workers.credentials import Credentials
from specwire.bonjour import mdns_interfaces
from specwire.errors import InvalidArgumentError
from specwire.pace import parse_pace
from specwire.protocol import BACKEND_PER_OP, BACKEND_STREAM
from specwire.speculation import ALLOCATIONS
from specwire.v1 import draft_pb2 as pb

FALLBACK_DRAFT = "default"


def add_credential_arguments(p: argparse.ArgumentParser) -> None:
    """Flags for the shared token and TLS."""
    p.add_argument(
        "--token-file",
        type=Path,
        help="file holding the shared token (else $SPECWIRE_TOKEN, else the config dir)",
    )
    p.add_argument(
        "--insecure", action="store_true", help="send no token proof and accept workers that ask for none"
    )
    p.add_argument("--tls-ca", type=Path, help="PEM CA certificate: reach workers over TLS and verify them")


def add_interface_argument(p: argparse.ArgumentParser) -> None:
    """The --interface flag: where Bonjour listens."""
    p.add_argument(
        "--interface",
        help="mDNS interfaces: 'all' or comma-separated IPv4 addresses (env SPECWIRE_MDNS_INTERFACES)",
    )


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    """Flags that choose and reach a worker, the drafting backend, and what to do if it is lost."""
    add_credential_arguments(p)
    p.add_argument(
        "--backend",
        default=BACKEND_STREAM,
        choices=[BACKEND_STREAM, BACKEND_PER_OP],
        help="remote drafting backend: the stream protocol, or the GGML_RPC-style per-op baseline",
    )
    p.add_argument(
        "--granularity",
        default="op",
        choices=GRANULARITIES,
        help="ggml-rpc backend only: operations per call (one op, one block, one forward pass, one round)",
    )
    p.add_argument(
        "--worker", help="worker to use: its Bonjour name, or HOST:PORT (default: the best discovered)"
    )
    add_interface_argument(p)
    p.add_argument(
        "--discover-timeout",
        type=float,
        default=DEFAULT_DISCOVER_TIMEOUT_S,
        help="seconds to wait for workers to answer on Bonjour",
    )
    add_worker_loss_arguments(p)
    p.add_argument(
        "--local-draft", default=FALLBACK_DRAFT, help="draft model for --on-worker-loss local and --fill"
    )
    p.add_argument(
        "--prespec",
        action="store_true",
        help="stream backend: the worker drafts the next round ahead while the target verifies",
    )
    add_prespec_arguments(p)
    p.add_argument(
        "--fill",
        action="store_true",
        help="with --prespec: the worker answers at once with the drafts it has ready for the verdict, and "
        "the --local-draft model drafts the rest here (drafting off the critical path when the worker is "
        "slower than this machine)",
    )
    p.add_argument(
        "--fill-push",
        action="store_true",
        help="with --fill: send the drafts made here to the worker as soon as they are made, so it plans "
        "the next round from them rather than drafting them again (Filled messages)",
    )
    p.add_argument(
        "--fill-tree",
        action="store_true",
        help="with --fill: the worker keeps one tree of likely continuations across rounds and drafts its "
        "likeliest nodes, several rounds ahead (--prespec-batch rows a pass; unset, the worker's "
        "--tree-rows, 16 by default); a tree drafts first choices, so sessions at temperature > 0 use "
        "plain --fill",
    )
    p.add_argument(
        "--multi-worker",
        nargs="?",
        const=DEFAULT_MODE,
        choices=MODES,
        help=f"draft on several workers at once (--worker a,b or all discovered), first reply wins: "
        f"race them on the same branches (the default, {DEFAULT_MODE}) or split the pre-speculation "
        "fan-out over them",
    )


def add_prespec_arguments(p: argparse.ArgumentParser) -> None:
    """Per-session overrides of a worker's pre-speculation settings (unset: the worker's own)."""
    p.add_argument("--prespec-budget", type=int, default=0, help="speculative forward passes per round")
    p.add_argument("--prespec-fanout", type=int, default=0, help="candidate tokens per position")
    p.add_argument(
        "--prespec-min-drafts",
        type=int,
        default=0,
        help="take a branch's drafts at once when this many are ready, even if fewer than k",
    )
    p.add_argument(
        "--prespec-batch",
        type=int,
        default=0,
        help="branches drafted side by side in one forward pass (1: one a pass)",
    )
    p.add_argument(
        "--prespec-allocation",
        default="",
        choices=["", *ALLOCATIONS],
        help="how the budget is split over outcomes",
    )


def add_worker_loss_arguments(p: argparse.ArgumentParser) -> None:
    """Flags for how long to wait for a worker, and what to do when it is lost."""
    p.add_argument(
        "--on-worker-loss",
        default="failover",
        choices=POLICIES,
        help="when a worker dies or stalls: next worker (then AR), local drafting, AR, or stop",
    )
    p.add_argument(
        "--round-timeout", type=float, default=ROUND_TIMEOUT_S, help="seconds to wait for a worker's reply"
    )


def add_fallback_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of the graded fallback (off unless --fallback)."""
    p.add_argument(
        "--fallback", action="store_true", help="shrink k, then stop drafting, when SD does not pay"
    )
    p.add_argument("--fallback-window", type=int, default=8, help="drafting rounds per fallback decision")
    p.add_argument("--min-acceptance", type=float, default=0.3, help="step down below this acceptance rate")
    p.add_argument(
        "--probe-after", type=int, default=32, help="autoregressive rounds before drafting is tried again"
    )


def add_pace_argument(p: argparse.ArgumentParser) -> None:
    """The --pace flag: emulate one machine of a hardware profile."""
    p.add_argument(
        "--pace",
        metavar="PROFILE:MACHINE",
        help="emulate the target machine of a hardware profile: every target (and local draft) pass runs "
        "for real and is held until that machine would be done (such as paper:m2-ultra; PROFILE is "
        "'paper' or a JSON file)",
    )


def pace_of(args: argparse.Namespace) -> CoordinatorPace | None:
    """The machine ``--pace`` names (checked before any model loads), or None."""
    text = getattr(args, "pace", None)
    return CoordinatorPace.of(parse_pace(text)) if text else None


def add_adaptive_k_argument(p: argparse.ArgumentParser) -> None:
    """The --adaptive-k flag (then --k is the largest k tried)."""
    p.add_argument(
        "--adaptive-k",
        action="store_true",
        help="choose k each round from measured acceptance and timings (--k is then the maximum)",
    )


def add_rollback_argument(p: argparse.ArgumentParser) -> None:
    """The --rollback choice (how a target with recurrent layers drops rejected drafts)."""
    p.add_argument(
        "--rollback",
        choices=STRATEGIES,
        default="auto",
        help="for targets with recurrent layers (Qwen3.5): 'states' keeps each position's state in the "
        "verification pass (dense Qwen3.5), 'replay' feeds the accepted positions again; "
        "auto: states where it can (KV-only targets just trim)",
    )


def prespec_request(args: argparse.Namespace, min_drafts: int = 0) -> pb.PreSpeculation:
    """The PreSpeculation message of the command line's overrides (enabled); ``min_drafts`` wins if set."""
    return pb.PreSpeculation(
        enabled=True,
        budget=args.prespec_budget,
        fanout=args.prespec_fanout,
        allocation=args.prespec_allocation,
        min_drafts=min_drafts or args.prespec_min_drafts,
        batch=args.prespec_batch,
        push=getattr(args, "fill_push", False),
        tree=getattr(args, "fill_tree", False),
    )


def worker_access(args: argparse.Namespace) -> WorkerAccess:
    """Credentials, mDNS interfaces and deadlines from the flags."""
    return WorkerAccess(
        credentials=Credentials.from_args(args),
        interfaces=mdns_interfaces(args.interface),
        discover_timeout=args.discover_timeout,
        round_timeout=getattr(args, "round_timeout", ROUND_TIMEOUT_S),
    )


def draft_spec(args: argparse.Namespace) -> DraftSpec:
    """The draft source ``--draft`` and the worker flags describe."""
    return DraftSpec.parse(
        args.draft,
        workers=tuple(w.strip() for w in (args.worker or "").split(",") if w.strip()),
        backend=args.backend,
        granularity=args.granularity,
        prespec=prespec_request(args) if args.prespec else None,
        multi=args.multi_worker or "",
        on_loss=args.on_worker_loss,
        fallback_draft=args.local_draft,
        fill=args.local_draft if getattr(args, "fill", False) else "",
    )


def fallback_settings(args: argparse.Namespace) -> FallbackSettings | None:
    """The settings the flags ask for, or None when the fallback is off (refused with --adaptive-k)."""
    if not args.fallback:
        return None
    if getattr(args, "adaptive_k", False):
        raise InvalidArgumentError("--fallback and --adaptive-k both choose k: use one")
    return FallbackSettings(args.fallback_window, args.min_acceptance, args.probe_after)
