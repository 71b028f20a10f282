"""``coordinator discover`` against real workers on 127.0.0.1: each is contacted with a Hello and checked
against the target (the tiny model: the command is the point)."""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from coordinator.commands import discover, serve
from tests.coordinator.workers.unfit import other_token_worker, other_vocabulary_worker
from tests.support.processes.cli import run_cli
from tests.support.processes.workers import WorkerProcess

DISCOVER = ["discover", "--interface", "127.0.0.1", "--discover-timeout", "4", "--target", "tiny"]


def test_discover_says_hello_to_each_worker_and_says_why_one_cannot_draft(
    tiny_worker: WorkerProcess, tmp_path: Path
) -> None:
    # Each run browses for the whole timeout: the two run at once, not in turn.
    with (
        other_vocabulary_worker(tmp_path) as vocab,
        other_token_worker(tmp_path) as token,
        ThreadPoolExecutor(2) as both,
    ):
        listing = both.submit(run_cli, "coordinator", *DISCOVER, "--json")
        table = both.submit(run_cli, "coordinator", *DISCOVER).result()
        listed = listing.result()
    assert listed.returncode == 0, listed.stderr
    assert "no weights are loaded" in listed.stderr  # the target's tokenizer only
    rows = {w["name"]: w for w in json.loads(listed.stdout)["workers"]}
    good, other_vocab, other_token = rows[tiny_worker.name], rows[vocab.name], rows[token.name]

    assert good["answered"] and good["token"] == "yes" and good["protocol"] == "compatible"
    assert good["fingerprint_match"] and good["can_draft"] and good["why_not"] is None
    assert good["model"] == "tiny" and good["address"] == tiny_worker.address

    assert other_vocab["answered"] and other_vocab["token"] == "yes"
    assert other_vocab["model"].endswith("other_vocab.gguf") and other_vocab["fingerprint_match"] is False
    assert not other_vocab["can_draft"] and "tokenize differently" in other_vocab["why_not"]

    assert not other_token["answered"] and other_token["token"] == "rejected"
    assert not other_token["can_draft"] and "another token" in other_token["why_not"]

    assert table.returncode == 0, table.stderr
    rows_part, _, reasons_part = table.stdout.partition("\n\n")  # the table, then a line per unfit worker
    header, *lines = rows_part.splitlines()
    assert header.split() == [
        "NAME",
        "ADDRESS",
        "LABEL",
        "PACED",
        "AS",
        "MODEL",
        "FP",
        "MATCH",
        "PROTOCOL",
        "TOKEN",
        "CAN",
        "DRAFT",
    ]
    by_name = {line.split()[0]: line.split() for line in lines}
    assert by_name[tiny_worker.name][-4:] == ["yes", "compatible", "yes", "yes"]
    assert by_name[vocab.name][-4:] == ["no", "compatible", "yes", "no"]
    assert by_name[token.name][-2:] == ["rejected", "no"]
    reasons = reasons_part.splitlines()
    assert all(" cannot draft for the target: " in r for r in reasons)
    assert any(r.startswith(f"{vocab.name} cannot draft") and "tokenize differently" in r for r in reasons)
    assert any(r.startswith(f"{token.name} cannot draft") and "another token" in r for r in reasons)
    assert not any(r.startswith(f"{tiny_worker.name} ") for r in reasons)


def test_discover_checks_against_the_target_serve_would_load() -> None:
    defaults = []
    for command in (discover, serve):
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        defaults.append(parser.parse_args([]).target)
    assert defaults[0] == defaults[1] == "default@float32"


def test_discover_takes_discover_timeout_as_every_command_does() -> None:
    out = run_cli("coordinator", "discover", "--timeout", "1")
    assert out.returncode == 2 and "unrecognized arguments: --timeout" in out.stderr
    out = run_cli("coordinator", "discover", "--discover-timeout", "0")
    assert out.returncode == 1 and "--discover-timeout must be above 0" in out.stderr
