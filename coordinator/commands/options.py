"""Command-line flags shared by the commands, and what they turn into.

Each ``add_*`` function adds one group of flags; the functions below them
turn parsed flags into the objects the rest of the coordinator takes
(``Credentials``, ``WorkerAccess``, ``DraftSpec``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from coordinator.decoding.rollback import STRATEGIES
from coordinator.drafting.factory import DEFAULT_DISCOVER_TIMEOUT_S, WorkerAccess
from coordinator.drafting.failover import POLICIES
from coordinator.drafting.ggml_rpc.model import GRANULARITIES
from coordinator.drafting.spec import DraftSpec
from coordinator.drafting.stream import ROUND_TIMEOUT_S
from coordinator.pacing import CoordinatorPace
from coordinator.workers.credentials import Credentials
from specwire.emulation.pace import parse_pace
from specwire.wire.bonjour import mdns_interfaces
from specwire.wire.protocol import BACKEND_PER_OP, BACKEND_STREAM

FALLBACK_DRAFT = "default"
DEFAULT_TARGET = "default@float32"


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


def add_interface_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The --interface flag: where Bonjour listens."""
    p.add_argument(
        "--interface",
        help="mDNS interfaces: 'all' or comma-separated IPv4 addresses (env SPECWIRE_MDNS_INTERFACES)",
    )


def add_discover_timeout_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The --discover-timeout flag: how long Bonjour answers are waited for."""
    p.add_argument(
        "--discover-timeout",
        type=float,
        default=DEFAULT_DISCOVER_TIMEOUT_S,
        help="seconds to wait for workers to answer on Bonjour",
    )


def add_target_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The --target flag: the target model (the same default in every command)."""
    p.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help="target model spec: default, FILE.gguf, DIR or HF id, optionally @float32/@float16",
    )


def add_local_draft_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The --local-draft flag: the draft model on this machine (a model spec, never a drafting policy)."""
    p.add_argument(
        "--local-draft",
        metavar="SPEC",
        default=FALLBACK_DRAFT,
        help="the draft model on this machine, for local SD, trees and auto ('none': no local drafting)",
    )


DRAFT_HELP = (
    "how to draft: auto (the set-up predicted fastest on this machine and its workers, re-decided as "
    "rounds are measured), local[:SPEC] (a draft model here; SPEC defaults to --local-draft), "
    "local-tree[:SPEC] (the same model drafting a tree, verified in one pass), remote[:MODE] (one "
    "worker; MODE stream, tree, or tree-verify: its tree verified whole; default stream), or none "
    "(autoregressive)"
)


def add_drafting_arguments(p: argparse.ArgumentParser, k_default: int = 4) -> None:
    """How to draft: the draft source, k, the local draft model and the workers; the advanced flags (what
    auto sets) in a group of their own."""
    p.add_argument("--draft", default="auto", help=DRAFT_HELP)
    p.add_argument(
        "--k",
        type=int,
        default=k_default,
        help="drafts per round for --draft local and remote; for trees, the deepest a round goes (auto "
        "chooses its own k each round)",
    )
    add_local_draft_argument(p)
    p.add_argument(
        "--worker",
        "--workers",
        metavar="NAMES",
        help="workers to draft on: Bonjour names or HOST:PORT, comma-separated, or none (default: every "
        "compatible one discovered; --draft remote takes the fastest that accepts this machine's token)",
    )
    add_interface_argument(p)
    add_discover_timeout_argument(p)
    add_credential_arguments(p)
    advanced = p.add_argument_group("advanced drafting (auto chooses these itself)")
    advanced.add_argument(
        "--backend",
        default=BACKEND_STREAM,
        choices=[BACKEND_STREAM, BACKEND_PER_OP],
        help="--draft remote: the stream protocol, or the GGML_RPC-style per-op baseline",
    )
    advanced.add_argument(
        "--granularity",
        default="op",
        choices=GRANULARITIES,
        help="--backend ggml-rpc: operations per call (one op, one block, one forward pass, one round)",
    )
    advanced.add_argument(
        "--rows",
        type=int,
        default=0,
        help="--draft remote:tree: nodes a worker expands side by side in a pass (0: its --tree-rows)",
    )
    add_worker_loss_arguments(advanced)


def add_worker_loss_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
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


def add_pace_argument(p: argparse.ArgumentParser) -> None:
    """The --pace flag: emulate one machine of a hardware profile."""
    p.add_argument(
        "--pace",
        metavar="PROFILE:MACHINE",
        help="emulate the target machine of a hardware profile: every target (and local draft) pass runs "
        "for real and is held until that machine would be done (such as paper:m2-ultra; PROFILE is "
        "'paper', 'm2-ultra-27b', 'm2-ultra-70b' or a JSON file)",
    )


def pace_of(args: argparse.Namespace) -> CoordinatorPace | None:
    """The machine ``--pace`` names (checked before any model loads), or None."""
    text = getattr(args, "pace", None)
    return CoordinatorPace.of(parse_pace(text)) if text else None


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


def worker_access(args: argparse.Namespace) -> WorkerAccess:
    """Credentials, mDNS interfaces and deadlines from the flags."""
    return WorkerAccess(
        credentials=Credentials.from_args(args),
        interfaces=mdns_interfaces(args.interface),
        discover_timeout=args.discover_timeout,
        round_timeout=getattr(args, "round_timeout", ROUND_TIMEOUT_S),
    )


def draft_spec(args: argparse.Namespace) -> DraftSpec:
    """The draft source ``--draft`` and the drafting flags describe."""
    local = "" if args.local_draft == "none" else args.local_draft
    return DraftSpec.parse(
        args.draft,
        local=local,
        workers=tuple(w.strip() for w in (args.worker or "").split(",") if w.strip()),
        backend=args.backend,
        granularity=args.granularity,
        rows=args.rows,
        on_loss=args.on_worker_loss,
    )
