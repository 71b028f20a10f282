"""``worker install``, ``status``, ``start`` and ``stop`` against a real port and a real service manager.

A port held by a real socket on 127.0.0.1 refuses install and start, naming
the holder. The agent is written into a temporary directory, which no service
manager loads: here (no user systemd, no launchd) the manager cannot be
asked, and status, start and stop must say so in one line and exit 1; with a
user systemd they find the agent not loaded. Nothing here starts a worker.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes.cli import one_error_line, run_cli
from worker.agent import agent_control
from worker.agent.agent import agent, default_kind

KINDS = ["launchd", "systemd"]


@pytest.fixture(autouse=True)
def own_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A home of the test's own, for the logs and the token file."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 that this test process listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _manager_answers(kind: str, directory: Path) -> bool:
    return agent_control.state(agent(kind, directory)).loaded is not None


def _agent(kind: str, directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("worker", *args, "--kind", kind, "--dir", str(directory))


@pytest.mark.parametrize("kind", KINDS)
def test_install_is_refused_while_its_port_is_taken_naming_the_holder(
    tmp_path: Path, held_port: int, kind: str
) -> None:
    out = run_cli("worker", "install", "--kind", kind, "--dir", str(tmp_path), "--", "--port", str(held_port))
    line = one_error_line(out.stderr)
    assert out.returncode == 1
    assert f"port {held_port} is in use by pid {os.getpid()}" in line and "python" in line
    assert not list(tmp_path.iterdir())


def test_install_is_refused_while_its_echo_port_is_taken(tmp_path: Path, held_port: int) -> None:
    serve = ["--port", str(_free_port()), "--echo-port", str(held_port)]
    out = run_cli("worker", "install", "--kind", "systemd", "--dir", str(tmp_path), "--", *serve)
    assert out.returncode == 1 and f"port {held_port} is in use" in one_error_line(out.stderr)


@pytest.mark.parametrize("kind", [default_kind()])  # the file each kind writes: the tests above
def test_start_is_refused_while_its_port_is_taken(tmp_path: Path, held_port: int, kind: str) -> None:
    serve = ["--port", str(_free_port()), "--echo-port", str(held_port)]
    written = run_cli("worker", "install", "--kind", kind, "--dir", str(tmp_path), "--no-load", "--", *serve)
    assert written.returncode == 0, written.stderr  # --no-load starts nothing, so checks no port
    out = _agent(kind, tmp_path, "start")
    assert out.returncode == 1 and f"port {held_port} is in use by pid {os.getpid()}" in one_error_line(
        out.stderr
    )


@pytest.mark.parametrize("kind", KINDS)
def test_status_of_an_installed_agent_shows_its_address_files_and_last_log_lines(
    tmp_path: Path, kind: str
) -> None:
    log = tmp_path / "logs" / "worker.log"
    log.parent.mkdir()
    log.write_text("".join(f"2025-01-01 12:00:{i:02d} INFO worker: line {i}\n" for i in range(30)))
    serve = ["--host", "127.0.0.1", "--port", "17170", "--log-file", str(log)]
    written = run_cli(
        "worker", "install", "--kind", kind, "--dir", str(tmp_path / "agents"), "--no-load", "--", *serve
    )
    assert written.returncode == 0, written.stderr
    out = _agent(kind, tmp_path / "agents", "status", "--json")
    report = json.loads(out.stdout)
    assert report["installed"] is True and report["running"] is False and report["pid"] is None
    assert report["address"] == "127.0.0.1:17170" and report["echo_ports"] == [17171]
    assert report["log"] == str(log) and report["file"] == str(agent(kind, tmp_path / "agents").path)
    assert [line.rsplit(" ", 1)[1] for line in report["last_lines"]] == [str(i) for i in range(20, 30)]
    if _manager_answers(kind, tmp_path / "agents"):  # a user systemd: the file in --dir is not what it runs
        assert out.returncode == 0 and report["loaded"] is False
    else:
        assert out.returncode == 1 and report["loaded"] is None
        assert "is not available here" in one_error_line(out.stderr)
    table = _agent(kind, tmp_path / "agents", "status", "--lines", "3").stdout
    assert "installed, not loaded" in table and "127.0.0.1:17170 (echo port 17171)" in table
    assert table.rstrip().endswith(
        "line 27\n  2025-01-01 12:00:28 INFO worker: line 28\n  2025-01-01 12:00:29 INFO worker: line 29"
    )


@pytest.mark.parametrize("kind", [default_kind()])  # the file each kind writes: the tests above
def test_status_of_no_agent_says_so(tmp_path: Path, kind: str) -> None:
    out = _agent(kind, tmp_path, "status", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["installed"] is False
    assert "not installed" in _agent(kind, tmp_path, "status").stdout


@pytest.mark.parametrize("kind", [default_kind()])  # the file each kind writes: the tests above
def test_stop_and_start_say_in_one_line_when_they_could_not(tmp_path: Path, kind: str) -> None:
    serve = ["--port", str(_free_port()), "--echo-port", str(_free_port())]
    written = run_cli("worker", "install", "--kind", kind, "--dir", str(tmp_path), "--no-load", "--", *serve)
    assert written.returncode == 0, written.stderr
    if _manager_answers(kind, tmp_path):
        pytest.skip(f"{kind} runs here: starting the agent would start a real worker")
    stop = _agent(kind, tmp_path, "stop")
    assert stop.returncode == 1 and "could not stop the worker agent" in one_error_line(stop.stderr)
    assert "is not available here" in stop.stderr
    start = _agent(kind, tmp_path, "start")
    assert start.returncode == 1 and "could not start the worker agent" in one_error_line(start.stderr)


@pytest.mark.parametrize("command", ["start", "stop"])
def test_start_and_stop_of_no_agent_are_a_clear_error(tmp_path: Path, command: str) -> None:
    out = _agent("systemd", tmp_path, command)
    assert out.returncode == 1 and "no worker agent is installed" in one_error_line(out.stderr)
