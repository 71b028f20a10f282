"""The test bed's paced preset for each emulated pair (``scripts/testbed/bench.py``); no namespaces needed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from testbed.bench import paced_preset
from testbed.topology import Topology


def _flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_the_hybrid_family_runs_the_hybrid_pair_in_the_same_preset_with_its_own_report() -> None:
    topo = Topology.build(["m2-ultra", "m1-max", "m2-pro"], "198.18.77.0/24", "1gbit", 0.15, ["", "", ""])
    llama, hybrid = paced_preset("paper", topo), paced_preset("paper", topo, "hybrid")
    assert (llama.worker_model, _flag(llama.bench_flags, "--target")) == ("tiny-draft", "tiny")
    assert hybrid.worker_model == _flag(hybrid.bench_flags, "--draft") == "tiny-hybrid-draft"
    assert _flag(hybrid.bench_flags, "--target") == "tiny-hybrid"
    assert hybrid.json == "testbed-paper-hybrid-bench.json" != llama.json
    assert hybrid.after[0][-1] == hybrid.json  # the planner checks this run's report
    others = [(a, b) for a, b in zip(llama.bench_flags, hybrid.bench_flags, strict=True) if a != b]
    assert others == [("tiny", "tiny-hybrid"), ("tiny-draft", "tiny-hybrid-draft")]
    assert llama.worker_flags == hybrid.worker_flags
