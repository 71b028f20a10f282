"""``coordinator plan --profile`` times this machine's passes against the profile's (``planning.fit``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwire.emulation.paper import load_profile
from tests.support.processes.cli import run_cli


def _fit(tmp: Path, *args: str) -> tuple[list[dict], str]:
    out = run_cli("coordinator", "plan", *args, "--ceiling-rounds", "0", "--json", str(tmp / "plan.json"))
    assert out.returncode == 0, out.stderr
    return json.loads((tmp / "plan.json").read_text())["fit"], out.stdout


def test_every_pass_of_the_papers_set_ups_is_timed_against_its_machine(tmp_path: Path) -> None:
    fit, _ = _fit(tmp_path, "--profile", "paper")
    by = {(f["machine"], f["model"], f["shape"]): f for f in fit}
    assert {f["machine"] for f in fit} == {"M2 Ultra", "M1 Max", "M2 Pro"}
    assert ("M2 Ultra", "target", "verify a 64-node tree") in by
    assert ("M2 Ultra", "draft", "a 4-node tree level") in by
    paper = load_profile("paper")
    for machine in paper.workers:
        for rows in (16, 64):
            f = by[machine.name, "draft", f"a {rows}-row tree pass"]
            assert machine.draft is not None and f["paced_s"] == pytest.approx(machine.draft.pass_s(rows))
            assert f["real_s"] > 0 and f["share"] == pytest.approx(f["real_s"] / f["paced_s"])


def test_a_profile_faster_than_this_machine_is_warned_of_pass_by_pass(tmp_path: Path) -> None:
    profile = {
        "name": "impossible Macs",
        "target_machine": "Quick",
        "target_tok_s": 1e6,  # a microsecond a pass: no real pass fits
        "local_draft_tok_s": 1e6,
        "workers": {"Quicker": 1e6},
        "mean_accepted": 2.0,
        "k": 4,
    }
    path = tmp_path / "fast.json"
    path.write_text(json.dumps(profile))
    fit, stdout = _fit(tmp_path, "--profile", str(path), "--family", "hybrid")
    assert fit and not any(f["fits"] for f in fit)
    warned = [line for line in stdout.splitlines() if line.startswith("warning:")]
    assert len(warned) == len(fit)
    assert any("Quicker's draft pass over a 64-row tree pass" in line for line in warned)
