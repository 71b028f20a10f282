"""``worker install`` and ``worker uninstall``: the launchd agent and the systemd user unit they write.

Both kinds are written into a temporary directory without loading them
(``--no-load``: this machine has neither a user launchd nor, in CI, a user
systemd); the files must parse and name this Python, ``-m worker.cli
serve``, the serve flags given and the environment the worker needs.
"""

from __future__ import annotations

import configparser
import os
import plistlib
import shlex
import sys
from pathlib import Path

import pytest

from tests.support.cli import one_error_line, run_cli

SERVE = ["--model", "mlx-community/Qwen3-0.6B-4bit", "--label", "M1 Max (office)", "--port", "7070"]


def _install(kind: str, directory: Path, *serve: str):  # type: ignore[no-untyped-def]
    return run_cli("worker", "install", "--kind", kind, "--dir", str(directory), "--no-load", "--", *serve)


def test_a_launchd_agent_runs_this_worker_with_its_flags_and_environment(tmp_path: Path) -> None:
    os.environ["SPECWIRE_MDNS_INTERFACES"] = "127.0.0.1"  # set by the suite; the agent must carry it
    out = _install("launchd", tmp_path, *SERVE)
    assert out.returncode == 0, out.stderr
    plist = plistlib.loads((tmp_path / "dev.specwire.worker.plist").read_bytes())
    assert plist["ProgramArguments"] == [sys.executable, "-m", "worker.cli", "serve", *SERVE]
    assert plist["EnvironmentVariables"]["SPECWIRE_MDNS_INTERFACES"] == "127.0.0.1"
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["StandardErrorPath"].endswith("Library/Logs/specwire/worker.log")
    assert "worker.log" in out.stderr and "not loaded" in out.stderr


def test_a_systemd_unit_runs_this_worker_with_its_flags_and_environment(tmp_path: Path) -> None:
    out = _install("systemd", tmp_path, *SERVE)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "specwire-worker.service"
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(path.read_text())
    service = unit["Service"]
    assert shlex.split(service["ExecStart"]) == [sys.executable, "-m", "worker.cli", "serve", *SERVE]
    assert service["Restart"] == "on-failure" and unit["Install"]["WantedBy"] == "default.target"
    assert "SPECWIRE_MDNS_INTERFACES=127.0.0.1" in shlex.split(service["Environment"])
    log = service["StandardOutput"]
    assert log.startswith("append:") and log.endswith("worker.log") and service["StandardError"] == log
    assert path.stat().st_mode & 0o077 == 0  # it may carry the token


@pytest.mark.parametrize("kind", ["launchd", "systemd"])
def test_install_then_uninstall_leaves_nothing(tmp_path: Path, kind: str) -> None:
    assert _install(kind, tmp_path, "--label", "x").returncode == 0
    assert len(list(tmp_path.iterdir())) == 1
    gone = run_cli("worker", "uninstall", "--kind", kind, "--dir", str(tmp_path), "--no-load")
    assert gone.returncode == 0, gone.stderr and not list(tmp_path.iterdir())
    again = run_cli("worker", "uninstall", "--kind", kind, "--dir", str(tmp_path), "--no-load")
    assert again.returncode == 1 and "no worker agent is installed" in one_error_line(again.stderr)


def test_a_serve_flag_that_does_not_exist_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = _install("systemd", tmp_path, "--modle", "x")
    assert out.returncode == 1 and "--modle" in one_error_line(out.stderr)
    assert not list(tmp_path.iterdir())
