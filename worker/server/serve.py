"""``worker serve``: load a draft model, serve it over gRPC, announce it over Bonjour
(``worker.server.server``).

This module holds the command's flags, which ``worker install``, ``start`` and ``status`` read too; the
server itself, with mlx-lm and gRPC, loads only when the command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specwire.drafting.ahead.prespec_config import TREE_MEMORY, TREE_ROWS
from specwire.drafting.prompt_cache_flags import add_prompt_cache_arguments
from specwire.errors import InvalidArgumentError
from specwire.models import DEFAULT_MODEL
from specwire.wire.protocol import BACKEND_PER_OP, BACKEND_STREAM
from worker.server.log_file import log_to_file

NAME = "serve"
HELP = "Serve a draft model over gRPC and announce it over Bonjour."
BACKENDS = (BACKEND_STREAM, BACKEND_PER_OP)
DEFAULT_PORT = 7070  # a worker's address stays the same across restarts; its echo service takes the next


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``worker serve``: what most people set first, the rest in groups of their own."""
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="draft model: default (the bundled one), FILE.gguf, an mlx-lm directory, or a Hugging Face "
        "id such as mlx-community/Qwen3-0.6B-4bit",
    )
    p.add_argument(
        "--label",
        default="",
        help='free text shown to coordinators, such as "M1 Max" (with --pace: the paced machine\'s name)',
    )
    p.add_argument("--name", help="Bonjour instance name (default: this host's name)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="port to listen on (0: any free port, printed at start)",
    )
    p.add_argument("--max-sessions", type=int, default=8, help="most concurrent sessions")
    p.add_argument(
        "--token-file",
        type=Path,
        help="file holding the shared token (default: $SPECWIRE_TOKEN, else the token in the config "
        "directory, which `worker token` shows and sets)",
    )
    p.add_argument("--json", action="store_true", help="print the ready line as JSON")
    network = p.add_argument_group("network and Bonjour")
    network.add_argument(
        "--interface",
        help="mDNS interfaces: 'all' or comma-separated IPv4 addresses (default: $SPECWIRE_MDNS_INTERFACES, "
        "else all)",
    )
    network.add_argument("--no-advertise", action="store_true", help="do not announce over Bonjour")
    network.add_argument(
        "--advertise-host", help="address to advertise instead of the listening one (e.g. a relay)"
    )
    network.add_argument(
        "--advertise-port", type=int, help="gRPC port to advertise instead of the listening one"
    )
    network.add_argument(
        "--echo-port",
        type=int,
        help="port of the raw TCP echo service the LAN probe times (default: --port + 1; with --port 0, "
        "any free port)",
    )
    network.add_argument(
        "--advertise-echo-port", type=int, help="echo port to advertise instead of the listening one"
    )
    network.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        help="seconds a silent session is kept before it is freed",
    )
    security = p.add_argument_group("security")
    security.add_argument(
        "--insecure", action="store_true", help="accept calls without the shared token (not for a shared LAN)"
    )
    security.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve over TLS")
    security.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    advanced = p.add_argument_group("advanced")
    advanced.add_argument("--backends", default=",".join(BACKENDS), help="drafting backends to offer")
    advanced.add_argument(
        "--log-file",
        type=Path,
        help="write the log, the ready line and warnings to this file instead of the terminal, rotated at "
        "10 MB, 3 old files kept (`worker install` sets it)",
    )
    advanced.add_argument(
        "--warmup-tokens", type=int, default=8, help="tokens drafted to measure the local draft speed"
    )
    advanced.add_argument(
        "--pace",
        metavar="PROFILE:MACHINE",
        help="emulate a machine of a hardware profile: every forward pass runs for real and is held until "
        "that machine would have finished it (such as paper:m1-max; PROFILE is 'paper', 'm2-ultra-27b', "
        "'m2-ultra-70b' or a JSON file). "
        "The worker says so in Bonjour, Hello and every reply",
    )
    advanced.add_argument(
        "--tree-rows",
        type=int,
        default=TREE_ROWS,
        help="nodes a tree session expands side by side in one pass, unless the coordinator asks for a "
        "number (its --rows)",
    )
    advanced.add_argument(
        "--tree-memory",
        type=float,
        default=TREE_MEMORY / 2**30,
        metavar="GIB",
        help="GiB all tree sessions' nodes may hold together: each node's K/V (one position) and, for a "
        "hybrid draft model such as Qwen3.5, its recurrent state; trees stop growing at the bound "
        "(0: no bound)",
    )
    add_prompt_cache_arguments(p.add_argument_group("prompt cache (each coordinator's, under its own key)"))


def run(args: argparse.Namespace) -> int:
    """Run ``worker serve`` until SIGINT or SIGTERM: the flags are checked here, then the server
    (``worker.server.server``) loads mlx-lm and gRPC, about a second that the agent commands reading these
    flags skip."""
    if args.log_file is not None:
        log_to_file(args.log_file)
    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    unknown = set(backends) - set(BACKENDS)
    if unknown or not backends:
        raise InvalidArgumentError(f"--backends: unknown {sorted(unknown)}; available: {', '.join(BACKENDS)}")
    if args.max_sessions < 1:
        raise InvalidArgumentError("--max-sessions must be at least 1")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidArgumentError("--tls-cert and --tls-key go together")
    from worker.server import server

    return server.run(args, backends)
