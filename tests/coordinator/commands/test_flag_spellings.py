"""Each flag has one spelling and one meaning in every command (the real parser, no run)."""

from __future__ import annotations

import contextlib
import io

import pytest

from coordinator.cli import COMMANDS
from coordinator.commands.bench import checked
from specwire.process.command_line import build_command_parser


def parse(*argv: str) -> object:
    parser = build_command_parser("coordinator", "", COMMANDS)
    with contextlib.redirect_stderr(io.StringIO()):
        return parser.parse_args(argv)


@pytest.mark.parametrize("command", ["bench", "plan"])
def test_draft_is_not_a_model_anywhere(command: str) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(command, "--draft", "tiny")
    assert exited.value.code == 2
    assert parse(command, "--local-draft", "tiny").local_draft == "tiny"  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_draft_is_the_drafting_policy(command: str) -> None:
    args = parse(command, "--draft", "local:tiny", "--local-draft", "tiny-draft")
    assert (args.draft, args.local_draft) == ("local:tiny", "tiny-draft")  # type: ignore[attr-defined]


def test_target_local_draft_and_discover_timeout_mean_the_same_in_every_command() -> None:
    commands = ["generate", "serve", "bench", "plan", "discover"]
    targets = {parse(c).target for c in commands}  # type: ignore[attr-defined]
    timeouts = {parse(c, "--discover-timeout", "7").discover_timeout for c in commands}  # type: ignore[attr-defined]
    local = {parse(c).local_draft for c in ("generate", "serve", "bench", "plan")}  # type: ignore[attr-defined]
    assert (targets, timeouts, local) == ({"default@float32"}, {7.0}, {"default"})


def test_bench_backend_names_still_parse() -> None:
    args = parse("bench", "--backend", "auto,local-tree,stream,stream+prespec+fill+tree,ggml-rpc")
    backends, granularities = checked(args)  # type: ignore[arg-type]
    assert backends == ["auto", "local-tree", "stream", "stream+prespec+fill+tree", "ggml-rpc"]
    assert granularities == ["op"]
