"""The test bed's paced preset for each emulated pair (``scripts/testbed/bench.py``); no namespaces needed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from testbed.bench import paced_preset
from testbed.topology import Topology, cpu_sets

from specwire.emulation.paper import load_profile


def _flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_the_hybrid_family_runs_the_hybrid_pair_in_the_same_preset_with_its_own_report() -> None:
    topo = Topology.build(["m2-ultra", "m1-max", "m2-pro"], "198.18.77.0/24", "1gbit", 0.15, ["", "", ""])
    llama, hybrid = paced_preset("paper", topo), paced_preset("paper", topo, "hybrid")
    assert (llama.worker_model, _flag(llama.bench_flags, "--target")) == ("tiny-draft", "tiny")
    assert hybrid.worker_model == _flag(hybrid.bench_flags, "--local-draft") == "tiny-hybrid-draft"
    assert _flag(hybrid.bench_flags, "--target") == "tiny-hybrid"
    assert hybrid.json == "testbed-paper-hybrid-bench.json" != llama.json
    assert hybrid.after[0][-1] == hybrid.json  # the planner checks this run's report
    others = [(a, b) for a, b in zip(llama.bench_flags, hybrid.bench_flags, strict=True) if a != b]
    assert others == [("tiny", "tiny-hybrid"), ("tiny-draft", "tiny-hybrid-draft")]
    assert llama.worker_flags == hybrid.worker_flags


def test_a_preset_takes_any_number_of_workers_each_paced_as_its_machine() -> None:
    hosts = {name: m.key for name, m in load_profile("paper").hosts(["m1-max", "m1-max", "m2-pro", "m2-pro"])}
    topo = Topology.build(["m2-ultra", *hosts], "198.18.77.0/24", "1gbit", 0.15, [""] * 5)
    preset = paced_preset("paper", topo, machines=hosts)
    assert preset.worker_flags == {
        "m1-max": ["--pace", "paper:m1-max"],
        "m1-max-2": ["--pace", "paper:m1-max", "--label", "M1 Max 2"],
        "m2-pro": ["--pace", "paper:m2-pro"],
        "m2-pro-2": ["--pace", "paper:m2-pro", "--label", "M2 Pro 2"],
    }
    assert _flag(preset.bench_flags, "--rows") == "16,32"  # each worker's tree at both widths, one run


def test_paced_hosts_are_pinned_the_coordinator_apart_when_cpus_are_few() -> None:
    assert cpu_sets(3, [0, 1])[0] == ["0", "1", "1"]
    assert cpu_sets(5, [0, 1, 2, 3])[0] == ["0", "1,2,3", "1,2,3", "1,2,3", "1,2,3"]
    assert cpu_sets(5, range(16))[0] == ["0,1,2,3", "4,5,6", "7,8,9", "10,11,12", "13,14,15"]
    assert cpu_sets(3, [5, 2])[0] == ["2", "5", "5"]  # the CPUs this process may use, not 0 up
    assert cpu_sets(3, [0])[0] == ["", "", ""]
