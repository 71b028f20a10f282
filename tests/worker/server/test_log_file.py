"""``worker serve --log-file``: the worker's own log, rotated, with what it prints in it
(``worker.server.log_file``), and the agent's output file kept small.

Each test runs a real process, since the log takes over the process's
logging, stdout and stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.processes.cli import run_cli
from worker.server.log_file import trim_output

WRITER = """
import logging, sys
from pathlib import Path
from worker.server.log_file import log_to_file

log_to_file(Path(sys.argv[1]), max_bytes=4096, backups=2)
logging.getLogger().setLevel(logging.INFO)
for i in range(300):
    logging.getLogger("worker.test").info("record %04d", i)
    print(f"printed {i:04d}")
print(f"a warning on stderr {i:04d}", file=sys.stderr)
"""


def test_the_log_rotates_and_holds_what_the_worker_prints(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "worker.log"
    done = subprocess.run(
        [sys.executable, "-c", WRITER, str(log)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""  # all of it went to the log
    files = sorted(p.name for p in log.parent.iterdir())
    assert files == ["worker.log", "worker.log.1", "worker.log.2"]  # two backups, the oldest dropped
    assert all((log.parent / f).stat().st_size <= 4096 for f in files)
    newest = log.read_text().splitlines()
    assert "INFO worker.test: record 0299" in newest[-3]
    assert "INFO stdout: printed 0299" in newest[-2]
    assert "WARNING stderr: a warning on stderr 0299" in newest[-1]
    assert "record 0000" not in "".join((log.parent / f).read_text() for f in files)


def test_serve_with_a_log_file_writes_its_error_there(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    out = run_cli("worker", "serve", "--log-file", str(log), "--backends", "carrier-pigeon")
    assert out.returncode == 1 and "error:" not in out.stderr
    assert "stderr: error: --backends: unknown ['carrier-pigeon']" in log.read_text()


def test_the_output_file_is_trimmed_to_its_tail_and_still_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "worker-output.log"
    path.write_bytes(b"".join(b"line %05d\n" % i for i in range(1000)))  # 11,000 bytes
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        trim_output(fd, max_bytes=5000, keep_bytes=1100)
        os.write(fd, b"after\n")
    finally:
        os.close(fd)
    lines = path.read_bytes().splitlines()
    assert (
        lines[0] == b"[earlier output trimmed]" and lines[1] == b"line 00900" and lines[-2] == b"line 00999"
    )
    assert lines[-1] == b"after"


def test_a_file_not_opened_for_appending_is_not_trimmed(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    path.write_bytes(b"x" * 10_000)
    fd = os.open(path, os.O_WRONLY)
    try:
        trim_output(fd, max_bytes=5000, keep_bytes=1000)
    finally:
        os.close(fd)
    assert path.stat().st_size == 10_000
