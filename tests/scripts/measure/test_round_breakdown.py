"""scripts/measure/round_breakdown.py against a real tiny-model worker on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.support.processes.workers import WorkerProcess

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "measure" / "round_breakdown.py"
PATH_PARTS = (
    "hop in",
    "encode",
    "to worker",
    "worker parse",
    "to compute",
    "compute",
    "from compute",
    "worker encode",
    "to coordinator",
    "decode",
    "hop out",
)


def test_the_parts_of_a_round_add_up_to_the_round(tiny_worker: WorkerProcess, tmp_path: Path) -> None:
    args = ["--worker", tiny_worker.address, "--rounds", "40", "--warmup", "4"]
    args += ["--max-tokens", "60", "--echoes", "20", "--echo-gap-ms", "5"]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json", str(tmp_path / "breakdown.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "specwire's own" in out.stdout
    (variant,) = json.loads((tmp_path / "breakdown.json").read_text())["variants"].values()
    assert variant["worker"]["pid"] == tiny_worker.pid and variant["same_clock"] is True
    assert variant["rounds"] == 40 and len(variant["grpc_echo_after_idle_us"]) == 20
    parts = variant["parts_us"]
    total = np.array(parts["total"])
    summed = sum(np.array(parts[p]) for p in PATH_PARTS)
    # Each instant is stamped once, so the parts tile the round but for the few statements between
    # stamps; the median round (robust to a round preempted there on a busy machine) is within 10%.
    assert np.median(np.abs(summed - total) / total) <= 0.10
    assert min(min(parts[p]) for p in PATH_PARTS) >= 0
    assert np.median(parts["compute"]) > 0 and np.all(np.array(parts["protocol"]) < total)
