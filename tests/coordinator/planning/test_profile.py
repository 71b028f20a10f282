"""``coordinator plan --profile``: the built-in paper profile and a profile file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.processes.cli import one_error_line, run_cli


def plan(*args: str, tmp: Path) -> dict:
    out = run_cli("coordinator", "plan", *args, "--json", str(tmp / "plan.json"))
    assert out.returncode == 0, out.stderr
    return dict(json.loads((tmp / "plan.json").read_text()))


def test_a_profile_file_is_projected_with_the_formulas(tmp_path: Path) -> None:
    profile = {
        "name": "two Macs",
        "target_tok_s": 40.0,
        "workers": {"mini": 100.0},
        "mean_accepted": 2.0,
        "k": 4,
        "link": {"rtt_ms": 1.0, "bandwidth_MBps": 1e9},
        "stream": {"per_round_ms": 3.0, "bytes_per_round": 0},
    }
    path = tmp_path / "macs.json"
    path.write_text(json.dumps(profile))
    out = plan("--profile", str(path), tmp=tmp_path)
    rows = {(r["machine"], r["backend"]): r for r in out["rows"]}
    assert out["profile"] == "two Macs" and out["ar_tok_s"] == pytest.approx(40.0)
    # 3 tokens per round of verify 25 ms + 4 drafts of 10 ms + 1 ms round trip + 3 ms protocol.
    assert rows["mini", "stream"]["tok_s"] == pytest.approx(3 / 0.069)
    assert "table11" not in out and ("target machine", "local SD") not in rows  # none given


def test_the_paper_profile_reproduces_table_7s_local_sd(tmp_path: Path) -> None:
    out = plan("--profile", "paper", "--ceiling-rounds", "600", tmp=tmp_path)
    local = next(c for c in out["table11"] if c["figure"] == "local SD")
    assert local["predicted"] == pytest.approx(local["paper"], rel=0.15)
    assert {r["machine"] for r in out["rows"]} == {"target machine", "M1 Max", "M2 Pro", "M1 Max + M2 Pro"}
    # Both Macs growing one tree is a model of a set-up no source runs: marked, and never the one to use.
    (both,) = [r for r in out["rows"] if r["machine"] == "M1 Max + M2 Pro"]
    assert both["built"] is False
    assert all(r.get("built", True) for r in out["rows"] if r is not both)
    assert out["use"]["machine"] != both["machine"]
    # Each tree-verifying row at the width auto's set-up opens: the widest pass that costs no more.
    assert {r["rows"] for r in out["rows"] if r["backend"] == "stream+tree-verify"} == {32}
    # The paper's draft walked per op by specwire, beside llama.cpp's graph nodes for it.
    walk = out["per_op_walk"]
    assert walk == {
        "ggml_nodes_per_pass": 1737,
        "walked_ops_per_pass": 18 * 13 + 6 * 15 + 5,  # tests/worker/per_op/test_op_walk.py traces it
        "blocks": {"gated_attention": 6, "gated_delta": 18},
    }
    # The ceiling: each Mac alone and both, at 16 rows a pass and at their widest, then a worker as fast as
    # the M2 Ultra's own draft model; no drafting on the paper's Macs reaches 1.25x local SD.
    ceiling = {(c["workers"], tuple(c["rows"])): c["tok_s"] for c in out["ceiling"]}
    local = next(r["best_tok_s"] for r in out["rows"] if r["backend"] == "local SD")
    macs = {tok_s for (name, _), tok_s in ceiling.items() if "Max" in name or "Pro" in name}
    assert len(macs) == 6 and max(macs) < 1.25 * local
    assert ceiling["M1 Max", (16,)] > ceiling["M2 Pro", (16,)]
    fastest = max(v for (name, _), v in ceiling.items() if name.startswith("one as fast"))
    assert fastest > max(macs)


def test_a_bad_profile_file_is_one_line_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"target_tok_s": -40, "workers": {"mini": 100}, "mean_accepted": 2, "k": 4}))
    out = run_cli("coordinator", "plan", "--profile", str(path))
    assert out.returncode == 1 and "target_tok_s must be > 0, got -40" in one_error_line(out.stderr)
    missing = run_cli("coordinator", "plan", "--profile", str(tmp_path / "none.json"))
    assert missing.returncode == 1 and "cannot read the profile" in one_error_line(missing.stderr)
