"""Every command in the README runs, as written, against the model pair it names.

The README's commands name ``mlx-community/Qwen3-8B-4bit`` and
``mlx-community/Qwen3-0.6B-4bit``; a Hugging Face cache written by the test
holds random-weight Qwen3 models of those ids (``tests/support/models/hub.py``),
so each command line is taken from the README's ``sh`` blocks and run by
the shell from the project root, word for word, with ``HF_HUB_OFFLINE=1``,
Bonjour on 127.0.0.1 and a home directory of its own (the token file, the
agent's files). The one-Mac walk-through follows the README's order:

1. the token: ``coordinator token show``, then ``worker token set`` with
   what it printed;
2. the terminal worker (``worker serve … --label "M1 Max"``, port 7070);
   while it runs, ``worker install`` is refused, naming what holds the port;
3. ``coordinator discover``, ``plan``, ``bench --backend
   auto,stream,ggml-rpc`` (every row lossless and verified, the per-op row
   on Qwen3; ``--max-tokens 64 --json FILE`` appended, because what is
   checked is that every row runs, not its figure: 64 tokens a prompt cost
   34 s of CPU here, the default 200 cost 60 s) and ``serve`` with a chat
   request, each finding the worker;
4. Ctrl-C ends the worker; ``worker install`` into a temporary directory
   (``--dir``, ``--no-load``: no service manager is touched), ``worker
   status``, ``worker uninstall``.

Only the set-up commands (``make demo``, ``make test``, the clone) are not
run here: CI runs them on a clean clone. The commands use the README's
fixed ports (7070, 7071, 8080), which no other test uses, and find every
worker on Bonjour: other tests' workers hold another token (this test's
home has a token file of its own), so every command leaves them out, saying
why.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shlex
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.models.hub import DRAFT_ID, TARGET_ID, write_readme_pair

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NOT_RUN = {  # command -> why this test does not run it
    "make demo   # the main job: the paper's Macs emulated, then a bench against two local workers": "CI",
    "make test   # lint (ruff), type check (mypy) and the test suite (pytest)": "CI runs it",
    "git clone URL-OF-YOUR-SPECWIRE-CLONE specwire && cd specwire && make install": "CI clones and installs",
}
READY_S = 120.0


def readme_commands() -> list[str]:
    """Every command line of the README's ``sh`` blocks, in order."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def command(start: str) -> str:
    """The README's one command line that starts with ``start``."""
    found = [c for c in readme_commands() if c.startswith(start)]
    assert len(found) == 1, f"{start!r}: {found}"
    return found[0]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("home")
    hf_home = tmp_path_factory.mktemp("hf")
    write_readme_pair(hf_home)
    environment = {k: v for k, v in os.environ.items() if k != "SPECWIRE_TOKEN"}
    environment |= {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "SPECWIRE_MDNS_INTERFACES": "127.0.0.1",
    }
    return environment


def sh(line: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run one README line with the shell, from the project root."""
    return subprocess.run(
        line, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def background(line: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start one README line with the shell (``exec``, so a signal reaches the command itself)."""
    return subprocess.Popen(
        f"exec {line}",
        shell=True,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_line(process: subprocess.Popen[str], pattern: str) -> str:
    """The first stdout line of ``process`` matching ``pattern`` (it dying or READY_S passing fails)."""
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline and selector.select(timeout=deadline - time.monotonic()):
        line = process.stdout.readline()
        if not line:
            break
        if re.search(pattern, line):
            return line
    process.kill()
    raise AssertionError(
        f"no line matching {pattern!r}; stderr:\n{process.stderr.read() if process.stderr else ''}"
    )


def get_json(url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def healthy(server: subprocess.Popen[str], url: str) -> dict:
    """``/health`` once the server answers it (polled: serve prints no machine-readable ready line)."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        try:
            return get_json(url)
        except OSError:
            time.sleep(0.2)
    raise AssertionError("coordinator serve did not answer /health")


def stopped(process: subprocess.Popen[str], sig: int = signal.SIGINT) -> int:
    """Signal ``process`` (Ctrl-C by default) and wait for its exit code."""
    process.send_signal(sig)
    try:
        return process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


@pytest.fixture(scope="module")
def terminal_worker(env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """Steps 2 and 3: the shared token, then the worker 'tried in a terminal'."""
    token = sh(command(".venv/bin/coordinator token show"), env)
    assert token.returncode == 0, token.stderr
    printed = token.stdout.strip()
    assert re.fullmatch(r"[\w-]{32,}", printed), token.stdout
    set_line = command(".venv/bin/worker token set").replace("PASTE-THE-TOKEN-HERE", shlex.quote(printed))
    assert sh(set_line, env).returncode == 0
    worker = background(command(".venv/bin/worker serve"), env)
    wait_for_line(worker, r"listening on 0\.0\.0\.0:7070 \(model " + re.escape(DRAFT_ID))
    yield worker
    if worker.poll() is None:
        worker.kill()
        worker.wait()


def test_every_readme_command_is_run_here_or_said_why_not() -> None:
    run_here = [
        ".venv/bin/coordinator token show",
        ".venv/bin/worker token set",
        ".venv/bin/worker serve",
        ".venv/bin/worker install",
        ".venv/bin/worker status",
        ".venv/bin/coordinator discover",
        ".venv/bin/coordinator plan",
        ".venv/bin/coordinator serve",
        ".venv/bin/coordinator bench",
    ]
    for line in readme_commands():
        assert line in NOT_RUN or any(line.startswith(start) for start in run_here), f"not tested: {line}"
    for start in run_here:
        command(start)  # each appears exactly once


def test_install_is_refused_while_the_terminal_worker_holds_the_port(
    env: dict[str, str], terminal_worker: subprocess.Popen[str]
) -> None:
    refused = sh(command(".venv/bin/worker install"), env)
    assert refused.returncode != 0
    assert f"port 7070 is in use by pid {terminal_worker.pid}" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_discover_finds_the_worker_and_says_it_can_draft(
    env: dict[str, str], terminal_worker: subprocess.Popen[str]
) -> None:
    line = command(".venv/bin/coordinator discover").split("#")[0].strip()
    out = sh(f"{line} --json", env)  # the same command, its table as JSON
    assert out.returncode == 0, out.stderr
    (mine,) = [w for w in json.loads(out.stdout)["workers"] if w["address"].endswith(":7070")]
    assert mine["label"] == "M1 Max" and mine["model"] == DRAFT_ID, mine
    assert mine["token"] == "yes" and mine["can_draft"] is True, mine
    assert mine["fingerprint_match"] is True, mine


def test_plan_measures_the_pair_and_the_worker(
    env: dict[str, str], terminal_worker: subprocess.Popen[str]
) -> None:
    out = sh(command(".venv/bin/coordinator plan"), env)
    assert out.returncode == 0, out.stderr
    assert f"worker M1 Max (127.0.0.1:7070, {DRAFT_ID})" in out.stdout, (out.stdout, out.stderr)
    assert "stream → M1 Max" in out.stdout and "auto would choose" in out.stdout


def test_bench_runs_every_row_lossless_and_verified(
    env: dict[str, str], terminal_worker: subprocess.Popen[str], tmp_path: Path
) -> None:
    line = command(".venv/bin/coordinator bench")
    assert line.endswith("--backend auto,stream,ggml-rpc")
    out = sh(f"{line} --max-tokens 64 --json {tmp_path / 'bench.json'}", env, timeout=600)
    assert out.returncode == 0, out.stderr
    bench = json.loads((tmp_path / "bench.json").read_text())
    labels = {row["label"] for row in bench["rows"]}
    assert {"AR (target only)", "local SD", "auto", "stream → M1 Max", "ggml-rpc/op → M1 Max"} <= labels
    for row in bench["rows"]:
        assert row["lossless"] is True, row["label"]
        if row["kind"] == "remote":
            assert row["verified"] is True, row["label"]
    (worker,) = [w for w in bench["workers"] if w["model"]["spec"] == DRAFT_ID]
    assert worker["ops_per_pass"] == 15 + 5  # Qwen3's walk: q/k norms, one block
    assert not [s for s in bench.get("skipped", []) if ":7070" in json.dumps(s)]


def test_serve_answers_a_request_and_says_the_worker_is_used(
    env: dict[str, str], terminal_worker: subprocess.Popen[str]
) -> None:
    server = background(command(".venv/bin/coordinator serve"), env)
    try:
        health = healthy(server, "http://127.0.0.1:8080/health")
        workers = [w for w in health["workers"] if str(w.get("address", "")).endswith(":7070")]
        assert workers and workers[0]["status"] == "used", health
        reply = get_json(
            "http://127.0.0.1:8080/v1/chat/completions",
            {
                "model": TARGET_ID,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
                "temperature": 0,
            },
        )
        assert reply["choices"][0]["message"]["content"] is not None
        assert reply["usage"]["completion_tokens"] == 8 or reply["choices"][0]["finish_reason"] == "stop"
        assert "specwire" in reply
    finally:
        assert stopped(server, signal.SIGTERM) == 0


def test_the_agent_installs_reports_and_uninstalls_once_the_terminal_worker_is_stopped(
    env: dict[str, str], terminal_worker: subprocess.Popen[str], tmp_path: Path
) -> None:
    assert stopped(terminal_worker) == 0  # Ctrl-C
    units = tmp_path / "units"
    line = command(".venv/bin/worker install").replace(
        "worker install", f"worker install --dir {units} --no-load", 1
    )
    out = sh(line, env)
    assert out.returncode == 0, out.stderr
    (unit,) = units.iterdir()
    text = unit.read_text()
    assert DRAFT_ID in text and "M1 Max" in text and "SPECWIRE_TOKEN" not in text
    status = sh(f"{command('.venv/bin/worker status').split('#')[0].strip()} --dir {units} --json", env)
    state = json.loads(status.stdout)
    assert state["installed"] is True and state.get("running") in (False, None), state
    assert sh(f".venv/bin/worker uninstall --dir {units}", env).returncode == 0
    assert not list(units.iterdir())
