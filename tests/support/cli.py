"""Running the project's command lines as real subprocesses."""

from __future__ import annotations

import subprocess
import sys


def run_cli(
    role: str, *args: str, timeout: float = 300, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m <role>.cli ARGS`` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", f"{role}.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        check=False,
    )


def one_error_line(stderr: str) -> str:
    """The stderr of a failed command, which must be exactly one ``error:`` line."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got:\n{stderr}"
    assert lines[0].startswith("error: ")
    assert "Traceback" not in stderr
    return lines[0]
