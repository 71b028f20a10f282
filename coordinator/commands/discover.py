"""``coordinator discover``: list the draft workers that answer on Bonjour."""

from __future__ import annotations

import argparse
import json

import anyio

from coordinator.commands.options import add_credential_arguments, add_interface_argument
from coordinator.workers.credentials import Credentials
from coordinator.workers.discovery import browse
from coordinator.workers.selection import incompatibility
from specwire.models import vocabulary_fingerprint_of
from specwire.wire.bonjour import WorkerAdvert, mdns_interfaces

NAME = "discover"
HELP = "List draft workers on the LAN (Bonjour) and whether they can draft for the target."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``coordinator discover``."""
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to listen for workers")
    add_interface_argument(p)
    p.add_argument(
        "--target", default="default", help="target model spec whose vocabulary workers must share"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    add_credential_arguments(p)


def row(advert: WorkerAdvert, fingerprint: str, credentials: Credentials) -> dict[str, object]:
    """One worker as the table and --json show it."""
    return {
        "name": advert.name,
        "address": advert.address,
        "label": advert.label,
        "model": advert.model,
        "fingerprint": advert.fingerprint,
        "fingerprint_match": advert.fingerprint == fingerprint,
        "compatible": incompatibility(advert, fingerprint, "stream", credentials) is None,
        "why_not": incompatibility(advert, fingerprint, "stream", credentials),
        "auth": advert.extra.get("auth", "none"),
        "tls": advert.extra.get("tls", "0") == "1",
        "backends": list(advert.backends),
        "draft_tok_s": advert.draft_tps,
        "host": advert.host,
        "pid": advert.pid,
        "protocol_version": advert.protocol_version,
        "pace": advert.extra.get("pace"),  # an emulated machine (worker serve --pace), or None
    }


def run(args: argparse.Namespace) -> int:
    """Run ``coordinator discover``."""
    interfaces = mdns_interfaces(args.interface)
    fingerprint = vocabulary_fingerprint_of(args.target)
    credentials = Credentials.from_args(args)
    rows = [row(a, fingerprint, credentials) for a in anyio.run(browse, interfaces, args.timeout)]
    if args.json:
        print(json.dumps({"target_fingerprint": fingerprint, "workers": rows}, indent=2))
        return 0
    if not rows:
        print(f"no workers answered within {args.timeout:g} s")
        return 0
    header = ("NAME", "ADDRESS", "LABEL", "MODEL", "FP MATCH", "DRAFT TOK/S", "PACED AS")
    table = [
        (
            r["name"],
            r["address"],
            r["label"] or "-",
            r["model"],
            "yes" if r["fingerprint_match"] else "no",
            f"{r['draft_tok_s']:.1f}",
            r["pace"] or "-",
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table, strict=False)]
    for line in (header, *table):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())
    return 0
