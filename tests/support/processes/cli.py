"""Running the project's command lines as real processes (forked from the test zygote where they can be)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import zygote


def run_cli(
    role: str, *args: str, timeout: float = 300, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m <role>.cli ARGS`` and capture its output."""
    return zygote.run([sys.executable, "-m", f"{role}.cli", *args], input=stdin, timeout=timeout)


def one_error_line(stderr: str) -> str:
    """The stderr of a failed command, which must be exactly one ``error:`` line."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got:\n{stderr}"
    assert lines[0].startswith("error: ")
    assert "Traceback" not in stderr
    return lines[0]
