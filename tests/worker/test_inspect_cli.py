"""``worker inspect`` prints what a worker would advertise."""

from __future__ import annotations

import json

from tests.support.processes.cli import one_error_line, run_cli


def test_inspect_default_model() -> None:
    out = run_cli("worker", "inspect", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["architecture"] == "llama"
    assert info["fingerprint"] == "v1:828729b754d5d82c"
    assert info["vocab_size"] == 49152 and info["layers"] == 30


def test_inspect_missing_model() -> None:
    out = run_cli("worker", "inspect", "--model", "no/such-model-here.gguf")
    assert out.returncode == 1
    one_error_line(out.stderr)
