"""``coordinator discover``: the draft workers Bonjour finds, each contacted, checked against the target.

It reads the target's vocabulary fingerprint from its tokenizer alone (no
weights are loaded), listens on Bonjour for ``--discover-timeout`` seconds,
then says Hello to every worker found with the shared token
(``coordinator.workers.survey``): whether it answers, takes the token and
proves its own, speaks this protocol, serves a model of the target's
vocabulary, and so can draft for the target, or why not. The target and its
default are those of ``serve``, so what ``discover`` says is what ``serve``
will find.
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
from zeroconf import InterfaceChoice

from coordinator.commands.options import (
    add_credential_arguments,
    add_discover_timeout_argument,
    add_interface_argument,
    add_target_argument,
)
from coordinator.workers.credentials import Credentials
from coordinator.workers.discovery import browse
from coordinator.workers.survey import WorkerCheck, survey
from specwire.errors import InvalidArgumentError
from specwire.models.loading import ModelSpec, vocabulary_fingerprint_of
from specwire.wire.bonjour import mdns_interfaces

NAME = "discover"
HELP = "List draft workers on the LAN (Bonjour), contact each, and say whether it can draft for the target."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``coordinator discover``."""
    add_target_argument(p)
    add_discover_timeout_argument(p)
    add_interface_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    add_credential_arguments(p)


def row(c: WorkerCheck, fingerprint: str) -> dict[str, object]:
    """One worker as the table and --json show it."""
    advert = c.advert
    return {
        "name": c.name,
        "address": advert.address,
        "label": advert.label,
        "model": c.model,
        "fingerprint": c.fingerprint,
        "fingerprint_match": c.fingerprint_match(fingerprint),
        "protocol": c.protocol,
        "protocol_version": c.protocol_version,
        "token": c.token,
        "answered": c.answered,  # False: model, fingerprint and protocol are the advertisement's
        "can_draft": c.can_draft,
        "why_not": c.why_not,
        "auth": advert.extra.get("auth", "none"),
        "tls": advert.extra.get("tls", "0") == "1",
        "backends": list(advert.backends),
        "draft_tok_s": c.draft_tok_s,
        "host": advert.host,
        "pid": advert.pid,
        "pace": advert.extra.get("pace"),  # an emulated machine (worker serve --pace), or None
    }


def run(args: argparse.Namespace) -> int:
    """Run ``coordinator discover``."""
    if args.discover_timeout <= 0:
        raise InvalidArgumentError(f"--discover-timeout must be above 0, got {args.discover_timeout:g}")
    interfaces = mdns_interfaces(args.interface)
    credentials = Credentials.from_args(args)
    _progress(f"reading the vocabulary of {args.target} ({_tokenizer_only(args.target)})")
    fingerprint = vocabulary_fingerprint_of(args.target)
    _progress(f"listening {args.discover_timeout:g} s for workers on Bonjour, then saying Hello to each")
    checks = anyio.run(_discover, interfaces, args.discover_timeout, fingerprint, args.target, credentials)
    rows = [row(c, fingerprint) for c in checks]
    if args.json:
        print(
            json.dumps({"target": args.target, "target_fingerprint": fingerprint, "workers": rows}, indent=2)
        )
        return 0
    if not rows:
        print(f"no workers answered on Bonjour within {args.discover_timeout:g} s")
        return 0
    _print_table(rows)
    return 0


async def _discover(
    interfaces: InterfaceChoice | list[str],
    timeout: float,
    fingerprint: str,
    target: str,
    credentials: Credentials,
) -> list[WorkerCheck]:
    adverts = await browse(interfaces, timeout)
    return await survey(adverts, fingerprint, target, credentials)


def _tokenizer_only(target: str) -> str:
    """What reading the target's vocabulary costs, for the progress line."""
    source = ModelSpec.parse(target).source
    if "/" in source and not source.startswith((".", "/", "~")) and not source.endswith(".gguf"):
        return "its tokenizer files only, downloaded if not cached; no weights"
    return "its tokenizer only; no weights are loaded"


def _progress(line: str) -> None:
    print(f"discover: {line}", file=sys.stderr, flush=True)


def _print_table(rows: list[dict[str, object]]) -> None:
    header = ("NAME", "ADDRESS", "LABEL", "PACED AS", "MODEL", "FP MATCH", "PROTOCOL", "TOKEN", "CAN DRAFT")
    table = [
        (
            r["name"],
            r["address"],
            r["label"] or "-",
            r["pace"] or "-",
            r["model"] or "-",
            "yes" if r["fingerprint_match"] else "no",
            r["protocol"],
            r["token"],
            "yes" if r["can_draft"] else "no",
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table, strict=False)]
    for line in (header, *table):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())
    reasons = [r for r in rows if not r["can_draft"]]
    if reasons:
        print()
    for r in reasons:
        print(f"{r['name']} cannot draft for the target: {r['why_not']}")
