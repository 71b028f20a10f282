"""``coordinator token`` and ``worker token``: one token for every Mac, shown on one and set on the others."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from specwire.wire.auth import TOKEN_ENV
from tests.support.processes.cli import one_error_line, run_cli


@pytest.fixture
def two_macs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Two config directories standing in for two Macs (the session's token variable unset)."""
    saved = {k: os.environ.get(k) for k in (TOKEN_ENV, "XDG_CONFIG_HOME")}
    os.environ.pop(TOKEN_ENV, None)
    try:
        yield tmp_path / "first", tmp_path / "second"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _on(mac: Path, role: str, *args: str, stdin: str | None = None):  # type: ignore[no-untyped-def]
    os.environ["XDG_CONFIG_HOME"] = str(mac)
    return run_cli(role, "token", *args, stdin=stdin)


def test_the_first_macs_token_is_set_on_the_second_in_one_step(two_macs: tuple[Path, Path]) -> None:
    first, second = two_macs
    shown = _on(first, "coordinator", "show")
    assert shown.returncode == 0 and "(created now)" in shown.stderr
    token = shown.stdout.strip()
    assert len(token) >= 32 and _on(first, "coordinator", "show").stdout.strip() == token  # kept
    kept = _on(second, "worker", "set", "-", stdin=token + "\n")
    assert kept.returncode == 0, kept.stderr
    path = second / "specwire" / "token"
    assert path.read_text().strip() == token and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _on(second, "worker", "show").stdout.strip() == token


def test_a_token_cut_short_is_refused_in_one_line(two_macs: tuple[Path, Path]) -> None:
    first, _ = two_macs
    out = _on(first, "worker", "set", "abc")
    assert out.returncode == 1 and "at least 16 characters" in one_error_line(out.stderr)
    assert not (first / "specwire" / "token").exists()
