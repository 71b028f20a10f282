"""A pytest plugin for test runs cut into time-limited calls (scripts/gpu/suite.sh loads it).

Where ``SPECWIRE_GPU_DONE`` names a file, each test's outcome is appended to
it as the test ends (``passed``, ``skipped``, ``error`` or ``failed``, then
its node id), the file closed at once, so a run cut off by the call's time limit
still leaves what it finished. A later run with the same file deselects the
tests already there and goes on with the rest. ``python3 gpu_progress.py
FILE`` prints the outcomes counted over every run.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest

ENV = "SPECWIRE_GPU_DONE"
RANK = ["passed", "skipped", "error", "failed"]  # a test's outcome is its worst phase's
_outcomes: dict[str, str] = {}


def _done_file() -> Path | None:
    path = os.environ.get(ENV)
    return Path(path) if path else None


def recorded(path: Path) -> dict[str, str]:
    """Node id to outcome, for every test the file holds."""
    if not path.exists():
        return {}
    lines = (line.split(" ", 1) for line in path.read_text().splitlines() if " " in line)
    return {nodeid: outcome for outcome, nodeid in lines}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = _done_file()
    if path is None:
        return
    done = recorded(path)
    deselected = [item for item in items if item.nodeid in done]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.nodeid not in done]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = _done_file()
    if path is None:
        return
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    else:
        outcome = "skipped" if report.skipped else "passed"
    before = _outcomes.get(report.nodeid, "passed")
    _outcomes[report.nodeid] = max(before, outcome, key=RANK.index)
    if report.when == "teardown":
        with path.open("a") as f:
            f.write(f"{_outcomes.pop(report.nodeid)} {report.nodeid}\n")


if __name__ == "__main__":
    counts = Counter(recorded(Path(sys.argv[1])).values())
    print(", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "none")
