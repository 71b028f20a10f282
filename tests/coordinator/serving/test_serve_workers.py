"""``coordinator serve`` says which workers it uses: at start on stderr, and in ``/health``.

Real processes on 127.0.0.1 (the tiny model): a worker that can draft, one
serving another vocabulary (its advertisement says so) and one holding
another token (only a Hello tells). Each unfit one must be named with its
reason, and auto's choice at T = 0 and T = 1 must be the one a request
then starts on.
"""

from __future__ import annotations

import os
import selectors
import time
from pathlib import Path

from tests.coordinator.serving.test_serve import TINY, chat
from tests.coordinator.workers.unfit import other_token_worker, other_vocabulary_worker
from tests.support.processes.servers import ServerProcess, running_server
from tests.support.processes.workers import WorkerProcess

LAST_LINE = "serve: auto at T = 1: "


def start_lines(server: ServerProcess, *awaited: str, timeout: float = 30.0) -> list[str]:
    """The ``serve:`` lines on stderr, once a line starting with each of ``awaited`` has come (all are
    printed before the ready line).

    Read from the pipe itself, so no line waits unseen in a reader's buffer."""
    assert server.process.stderr is not None
    fd = server.process.stderr.fileno()
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    text = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and selector.select(timeout=deadline - time.monotonic()):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        text += chunk
        lines = [x for x in text.decode(errors="replace").splitlines() if x.startswith("serve: ")]
        if all(any(x.startswith(a) for x in lines) for a in awaited) and text.endswith(b"\n"):
            return lines
    raise AssertionError(f"not every one of {awaited} starts a line in:\n{text.decode(errors='replace')}")


def test_serve_names_each_worker_used_or_skipped_and_auto_s_choice(
    tiny_worker: WorkerProcess, tmp_path: Path
) -> None:
    with (
        other_vocabulary_worker(tmp_path, "serve-vocab") as vocab,
        other_token_worker(tmp_path, "serve-token") as token,
    ):
        flags = [*TINY, "--local-draft", "tiny", "--api-key", "k", "--discover-timeout", "4"]
        with running_server(*flags) as server:
            lines = start_lines(
                server, *(f"serve: worker {w.name} " for w in (tiny_worker, vocab, token)), LAST_LINE
            )
            health = server.health(api_key="k")
            stranger = server.health()
            greedy = chat(server.client(api_key="k")).model_extra["specwire"]  # type: ignore[attr-defined]
            after = server.health(api_key="k")

    said = {line.split(" at ")[0].removeprefix("serve: worker "): line for line in lines if "worker " in line}
    assert (
        said[tiny_worker.name]
        == f"serve: worker {tiny_worker.name} at {tiny_worker.address}: used, auto plans with it"
    )
    assert said[vocab.name].startswith(f"serve: worker {vocab.name} at {vocab.address}: skipped, vocabulary ")
    assert "differs from the target's" in said[vocab.name]
    assert said[token.name].startswith(
        f"serve: worker {token.name} at {token.address}: skipped, token rejected: "
    )
    assert "another token" in said[token.name]

    listed = {w["name"]: w for w in health["workers"]}
    assert listed[tiny_worker.name] == {
        "name": tiny_worker.name,
        "address": tiny_worker.address,
        "status": "used",
        "reason": "auto plans with it",
    }
    for unfit in (vocab, token):
        entry = listed[unfit.name]
        assert entry["status"] == "skipped" and said[unfit.name].endswith(f": skipped, {entry['reason']}")

    choices = health["auto"]["choices"]
    assert [c["temperature"] for c in choices] == [0.0, 1.0]
    assert all(c["predicted_tok_s"] > 0 for c in choices)
    for c, line in zip(choices, [x for x in lines if x.startswith("serve: auto at T = ")], strict=True):
        predicted = f"predicted {c['predicted_tok_s']:.1f} tok/s"
        assert line == f"serve: auto at T = {c['temperature']:g}: {c['setup']}, {predicted}"
    # A greedy request starts on the set-up /health named for T = 0, at the tok/s it predicted.
    chosen = greedy["drafting"]["chosen"]
    assert chosen["setup"] == choices[0]["setup"]
    assert chosen["predicted"][0]["tok_s"] == choices[0]["predicted_tok_s"]
    assert after["auto"] == health["auto"] and "workers" not in stranger and "auto" not in stranger


def test_serve_remote_says_which_worker_it_drafts_on_and_why_the_others_wait(
    tiny_worker: WorkerProcess, tmp_path: Path
) -> None:
    with other_token_worker(tmp_path, "serve-remote-token") as token:
        remote = ["--draft", "remote", "--worker", tiny_worker.name, "--discover-timeout", "3"]
        with running_server(*TINY, *remote) as server:
            lines = start_lines(server, f"serve: worker {token.name} ", f"serve: worker {tiny_worker.name} ")
            listed = {w["name"]: w for w in server.health()["workers"]}
    used = f"serve: worker {tiny_worker.name} at {tiny_worker.address}: used, "
    assert used + "--draft remote drafts on it (stream)" in lines
    assert listed[tiny_worker.name]["status"] == "used"
    assert listed[token.name] == {
        "name": token.name,
        "address": token.address,
        "status": "skipped",
        "reason": f"not named in --worker ({tiny_worker.name})",
    }
    assert not any(line.startswith("serve: auto at") for line in lines)
