"""Hardware profiles: the pass curve, the built-in profiles (the paper's Macs, and the M2 Ultra with a 27B or
70B target), and files refused by field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwire.emulation.pace import parse_pace
from specwire.emulation.paper import load_profile
from specwire.emulation.profile import PassCurve, Profile
from specwire.errors import InvalidArgumentError

GOOD = {"target_tok_s": 40, "workers": {"mini": 100}, "mean_accepted": 2, "k": 4}


def test_a_pass_is_flat_until_prompt_speed_binds() -> None:
    curve = PassCurve(decode_tok_s=40.0, prefill_tok_s=1000.0)
    assert curve.pass_s(1) == curve.pass_s(5) == curve.pass_s(1, sequences=5) == pytest.approx(0.025)
    assert curve.pass_s(100) == pytest.approx(0.1)  # compute-bound: 100 positions at 1,000 a second
    assert PassCurve(40.0, per_position_s=0.001).pass_s(5) == pytest.approx(0.029)


def test_the_paper_profile_has_its_three_machines() -> None:
    paper = load_profile("paper")
    assert [m.key for m in paper.machines] == ["m2-ultra", "m1-max", "m2-pro"]
    assert 1 / paper.target.pass_s(5) == pytest.approx(42.4)  # k + 1 positions cost one (4.5.1)
    assert 1 / paper.machine("M1 Max").draft.pass_s() == pytest.approx(86.6)  # type: ignore[union-attr]
    assert paper.mean_accepted == pytest.approx(1.78, abs=0.01)
    with pytest.raises(InvalidArgumentError, match="has no machine 'm3-max'; it has m2-ultra, m1-max"):
        paper.machine("m3-max")


@pytest.mark.parametrize(
    ("name", "decode_tok_s", "prefill_tok_s"),
    [("m2-ultra-27b", 19.17, 388.0), ("m2-ultra-70b", 12.83, 149.6)],
)
def test_the_big_targets_are_the_paper_s_macs_with_the_target_scaled_by_its_law(
    name: str, decode_tok_s: float, prefill_tok_s: float
) -> None:
    """Decode bound by the weights read (42.4 tok/s x 12.07 GB, Table 6), prompt rate by the parameters."""
    paper, big = load_profile("paper"), load_profile(name)
    assert big.name == name
    assert big.target.decode_tok_s == pytest.approx(decode_tok_s, abs=0.01)
    assert big.target.prefill_tok_s == pytest.approx(prefill_tok_s, abs=0.1)
    assert 1 / big.target.pass_s(5) == pytest.approx(decode_tok_s, abs=0.01)  # k + 1 positions cost one
    assert big.workers == paper.workers and big.local_draft == paper.local_draft
    assert (big.mean_accepted, big.k, big.link_rtt_s, big.agreement) == (
        paper.mean_accepted,
        paper.k,
        paper.link_rtt_s,
        paper.agreement,
    )
    pace = parse_pace(f"{name}:m1-max")  # a worker paced as the M1 Max of this set-up
    assert pace.profile.name == name and pace.machine.draft == paper.machine("m1-max").draft


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"target_tok_s": None}, "target_tok_s is missing"),
        ({"target_tok_s": -40}, "target_tok_s must be > 0, got -40"),
        ({"target_tok_s": "fast"}, "target_tok_s must be a number, got 'fast'"),
        ({"workers": {"mini": {"draft_tok_s": 0}}}, "workers.mini.draft_tok_s must be > 0"),
        ({"workers": {}}, "workers must be an object"),
        ({"mean_accepted": 5}, "mean_accepted (5.0) cannot exceed k (4)"),
        ({"k": 2.5}, "k must be a whole number"),
        ({"link": {"rtt_ms": -1}}, "link.rtt_ms must be >= 0"),
        ({"agreement": {"top2": 1.5}}, "agreement rates must lie within 0..1"),
    ],
)
def test_a_bad_field_is_named(tmp_path: Path, change: dict, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps({key: value for key, value in {**GOOD, **change}.items() if value is not None})
    )
    with pytest.raises(InvalidArgumentError, match=f"profile {path}: .*") as refused:
        Profile.load(path)
    assert words in str(refused.value)


def test_a_set_up_may_repeat_a_drafting_machine_as_hosts_of_their_own() -> None:
    paper = load_profile("paper")
    hosts = paper.hosts(["m1-max", "M1 Max", "m2-pro", "m1-max"])
    assert [(name, m.name) for name, m in hosts] == [
        ("m1-max", "M1 Max"),
        ("m1-max-2", "M1 Max"),
        ("m2-pro", "M2 Pro"),
        ("m1-max-3", "M1 Max"),
    ]
    assert [name for name, _ in paper.hosts()] == ["m1-max", "m2-pro"]
    with pytest.raises(InvalidArgumentError, match="target machine"):
        paper.hosts(["m2-ultra"])
    with pytest.raises(InvalidArgumentError, match="no machine 'm3-max'"):
        paper.hosts(["m3-max"])
