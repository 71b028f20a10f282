"""``worker token`` and ``coordinator token``: show this machine's shared token, or set it.

Every Mac of one set-up holds the same token: the coordinator proves it on
every call and each worker checks it. On the first Mac, ``coordinator token
show`` prints it (creating it if there is none yet); on every other,
``worker token set TOKEN`` (or ``... | worker token set -``) writes it where
both commands look for it, mode 0600. Both roles share this command.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from specwire.errors import InvalidArgumentError
from specwire.wire.auth import TOKEN_ENV, create_token, default_token_path, find_token, write_token

NAME = "token"
HELP = "Show this machine's shared token (created if there is none), or set it to another Mac's."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``token``."""
    actions = p.add_subparsers(dest="action", required=True, metavar="{show,set}")
    show = actions.add_parser("show", help="print the token on stdout, and where it is kept on stderr")
    show.add_argument("--token-file", type=Path, help="a file holding the token, instead of the default")
    put = actions.add_parser("set", help="keep TOKEN (another Mac's) as this machine's token")
    put.add_argument("token", help="the token, or - to read it from stdin")
    put.add_argument("--token-file", type=Path, help="where to keep it (default: the config directory's)")


def run(args: argparse.Namespace) -> int:
    """Run ``token show`` or ``token set``."""
    if args.action == "show":
        token, where = find_token(args.token_file), _source(args.token_file)
        if token is None:
            token, where = create_token(default_token_path()), f"{default_token_path()} (created now)"
        print(token)
        print(f"the shared token, from {where}", file=sys.stderr)
        return 0
    token = sys.stdin.read().strip() if args.token == "-" else args.token.strip()
    path = args.token_file or default_token_path()
    write_token(path, token)
    print(f"kept the shared token in {path} (mode 0600); restart this machine's worker", file=sys.stderr)
    if os.environ.get(TOKEN_ENV) and args.token_file is None:
        raise InvalidArgumentError(f"${TOKEN_ENV} is set here and wins over {path}: unset it")
    return 0


def _source(token_file: Path | None) -> str:
    """Where ``find_token`` takes the token from."""
    if token_file is not None:
        return str(token_file)
    return f"${TOKEN_ENV}" if os.environ.get(TOKEN_ENV) else str(default_token_path())
