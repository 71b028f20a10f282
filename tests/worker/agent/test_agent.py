"""``worker install`` and ``worker uninstall``: the launchd agent and the systemd user unit they write.

Both kinds are written into a temporary directory without loading them
(``--no-load``: this machine has neither a user launchd nor, in CI, a user
systemd); the files must parse and name this Python, ``-m worker.cli
serve``, the serve flags given (every flag ``worker serve`` takes, relative
paths made absolute), the log file, the directory install ran in, and the
environment the worker needs, never the token.
"""

from __future__ import annotations

import configparser
import os
import plistlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from specwire.wire.auth import TOKEN_ENV, default_token_path, write_token
from tests.support.processes.cli import one_error_line, run_cli
from worker.agent import serve_flags

SERVE = ["--model", "mlx-community/Qwen3-0.6B-4bit", "--label", "M1 Max (office)", "--port", "0"]


@pytest.fixture(autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of the test's own: the agent's logs and the token file go under it, on Linux and macOS."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    return home / ".local" / "state"


def _install(kind: str, directory: Path, *serve: str) -> subprocess.CompletedProcess[str]:
    return run_cli("worker", "install", "--kind", kind, "--dir", str(directory), "--no-load", "--", *serve)


def _unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(path.read_text())
    return unit


def _usage_options(usage: str) -> set[str]:
    return set(re.findall(r"\[(--[a-z][a-z-]*)", usage))


def test_a_launchd_agent_runs_this_worker_with_its_flags_and_environment(tmp_path: Path) -> None:
    os.environ["SPECWIRE_MDNS_INTERFACES"] = "127.0.0.1"  # set by the suite; the agent must carry it
    out = _install("launchd", tmp_path / "agents", *SERVE)
    assert out.returncode == 0, out.stderr
    plist = plistlib.loads((tmp_path / "agents" / "dev.specwire.worker.plist").read_bytes())
    log = str(Path.home() / "Library" / "Logs" / "specwire" / "worker.log")
    assert plist["ProgramArguments"] == [
        sys.executable,
        "-m",
        "worker.cli",
        "serve",
        *SERVE,
        "--log-file",
        log,
    ]
    assert plist["EnvironmentVariables"]["SPECWIRE_MDNS_INTERFACES"] == "127.0.0.1"
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["WorkingDirectory"] == os.getcwd()
    assert plist["StandardErrorPath"].endswith("Library/Logs/specwire/worker-output.log")
    assert "not loaded" in out.stderr


def test_a_systemd_unit_runs_this_worker_with_its_flags_and_environment(
    tmp_path: Path, state_home: Path
) -> None:
    out = _install("systemd", tmp_path / "units", *SERVE)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "units" / "specwire-worker.service"
    unit = _unit(path)
    service = unit["Service"]
    log = str(state_home / "specwire" / "worker.log")
    assert shlex.split(service["ExecStart"]) == [
        sys.executable, "-m", "worker.cli", "serve", *SERVE, "--log-file", log
    ]  # fmt: skip
    assert service["Restart"] == "on-failure" and unit["Install"]["WantedBy"] == "default.target"
    assert "SPECWIRE_MDNS_INTERFACES=127.0.0.1" in shlex.split(service["Environment"])
    assert service["WorkingDirectory"] == os.getcwd()
    output = service["StandardOutput"]
    assert output == f"append:{state_home / 'specwire' / 'worker-output.log'}"
    assert service["StandardError"] == output
    assert path.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("kind", ["launchd", "systemd"])
def test_the_token_is_never_written_into_the_agent(tmp_path: Path, kind: str) -> None:
    token = os.environ[TOKEN_ENV]  # the suite sets one, and no token file in its config directory
    out = _install(kind, tmp_path, *SERVE)
    assert out.returncode == 0, out.stderr
    (agent,) = tmp_path.iterdir()
    assert token not in agent.read_bytes().decode() and TOKEN_ENV not in agent.read_bytes().decode()
    note = [line for line in out.stderr.splitlines() if line.startswith("note:")]
    assert len(note) == 1 and "is not written into the agent" in note[0] and "worker token set" in note[0]


def test_the_note_is_not_given_when_the_token_file_holds_the_same_token(tmp_path: Path) -> None:
    write_token(default_token_path(), os.environ[TOKEN_ENV])
    out = _install("systemd", tmp_path, *SERVE)
    assert out.returncode == 0, out.stderr
    assert "note:" not in out.stderr


def test_relative_paths_are_stored_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "models" / "x").mkdir(parents=True)
    (tmp_path / "my-macs.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    serve = ["--model", "./models/x@float16", "--tls-cert", "tls/cert.pem", "--tls-key=tls/key.pem"]
    serve += ["--pace", "my-macs.json:m1-max", "--label", "models"]
    out = _install("systemd", tmp_path / "units", *serve)
    assert out.returncode == 0, out.stderr
    service = _unit(tmp_path / "units" / "specwire-worker.service")["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[argv.index("--model") + 1] == f"{tmp_path}/models/x@float16"
    assert (
        argv[argv.index("--tls-cert") + 1] == f"{tmp_path}/tls/cert.pem"
    )  # a path flag: absolute, even if absent
    assert f"--tls-key={tmp_path}/tls/key.pem" in argv
    assert argv[argv.index("--pace") + 1] == f"{tmp_path}/my-macs.json:m1-max"
    assert argv[argv.index("--label") + 1] == "models"  # free text, though a directory has that name
    assert service["WorkingDirectory"] == str(tmp_path)


def test_a_hugging_face_id_is_kept_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = _install(
        "launchd", tmp_path / "agents", "--model", "mlx-community/Qwen3-0.6B-4bit", "--pace", "paper:m1-max"
    )
    assert out.returncode == 0, out.stderr
    argv = plistlib.loads((tmp_path / "agents" / "dev.specwire.worker.plist").read_bytes())[
        "ProgramArguments"
    ]
    assert argv[argv.index("--model") + 1] == "mlx-community/Qwen3-0.6B-4bit"
    assert argv[argv.index("--pace") + 1] == "paper:m1-max"


def test_install_takes_every_flag_worker_serve_takes(tmp_path: Path) -> None:
    help_text = run_cli("worker", "serve", "--help").stdout
    served = _usage_options(help_text.split("\n\n")[0])
    assert {"--model", "--port", "--log-level", "--log-file"} <= served
    assert _usage_options(serve_flags.parser().format_usage()) == served
    out = _install("systemd", tmp_path, "--log-level", "info", "--json", "--tree-rows", "4", *SERVE)
    assert out.returncode == 0, out.stderr
    assert "--log-level info" in (tmp_path / "specwire-worker.service").read_text()


def test_a_log_file_given_is_kept(tmp_path: Path) -> None:
    out = _install("systemd", tmp_path, *SERVE, "--log-file", "/var/tmp/w.log")
    assert out.returncode == 0, out.stderr
    argv = shlex.split(_unit(tmp_path / "specwire-worker.service")["Service"]["ExecStart"])
    assert argv.count("--log-file") == 1 and argv[argv.index("--log-file") + 1] == "/var/tmp/w.log"


@pytest.mark.parametrize("kind", ["launchd", "systemd"])
def test_install_then_uninstall_leaves_nothing(tmp_path: Path, kind: str) -> None:
    assert _install(kind, tmp_path, "--label", "x").returncode == 0
    assert len(list(tmp_path.iterdir())) == 1
    gone = run_cli("worker", "uninstall", "--kind", kind, "--dir", str(tmp_path), "--no-load")
    assert gone.returncode == 0, gone.stderr and not list(tmp_path.iterdir())
    again = run_cli("worker", "uninstall", "--kind", kind, "--dir", str(tmp_path), "--no-load")
    assert again.returncode == 1 and "no worker agent is installed" in one_error_line(again.stderr)


@pytest.mark.parametrize("flags", [["--modle", "x"], ["--port", "seventy"], ["--log-level", "loud"]])
def test_a_serve_flag_worker_serve_refuses_is_refused_before_anything_is_written(
    tmp_path: Path, flags: list[str]
) -> None:
    out = _install("systemd", tmp_path, *flags)
    assert out.returncode == 1 and flags[0] in one_error_line(out.stderr)
    assert not list(tmp_path.iterdir())
