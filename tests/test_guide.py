"""The guide holds: every relative link and #anchor in README.md and docs/ resolves, every command the
README's shell blocks run exists with every flag they give it, and every flag the README names is some
command's."""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```(?:sh|bash|console)?\n(.*?)```", re.S)
ROLES = {"worker": "worker", "coordinator": "coordinator"}
SUBCOMMANDS = {
    "worker": ("serve", "install", "uninstall", "status", "stop", "start", "token", "inspect"),
    "coordinator": ("generate", "serve", "bench", "plan", "discover", "token"),
}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces as -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor in ``page`` (outside code blocks), duplicates numbered as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    text = FENCE.sub("", page.read_text())
    for line in text.splitlines():
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert broken == []


def test_the_readme_stays_a_day_one_guide() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


@functools.cache
def help_text(role: str, sub: str) -> str:
    """``ROLE SUB --help``, which must succeed (in this process: a subprocess each costs a second)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        importlib.import_module(f"{role}.cli").main([sub, "--help"])
    assert exited.value.code == 0
    return out.getvalue()


def shell_commands() -> list[list[str]]:
    """The commands of the README's shell blocks, as words (comments and continuations handled)."""
    commands = []
    for block in FENCE.findall((ROOT / "README.md").read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            for part in " ".join(words).split(" && "):
                if part.strip():
                    commands.append(part.split())
    return commands


def test_every_command_in_the_readmes_shell_blocks_exists_with_its_flags() -> None:
    checked = 0
    makefile = (ROOT / "Makefile").read_text()
    for words in shell_commands():
        program = Path(words[0]).name
        if program in ROLES and len(words) > 1:
            role, sub = ROLES[program], words[1]
            assert sub in SUBCOMMANDS[role], f"{program} {sub}: no such command"
            text = help_text(role, sub)
            rest = words[2 : words.index("--")] if "--" in words else words[2:]
            for flag in (w.split("=")[0] for w in rest if w.startswith("--")):
                assert flag in text, f"{program} {sub} has no {flag}"
            checked += 1
        elif program == "make":
            for target in (w for w in words[1:] if "=" not in w):
                assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"make {target}: no such target"
            checked += 1
        elif program in ("python", "python3") and len(words) > 1 and words[1].startswith("scripts/"):
            assert (ROOT / words[1]).exists(), words[1]
            checked += 1
    assert checked >= 8  # the set-up commands and the ones for your Macs


def test_every_flag_the_readme_names_is_one_of_a_commands() -> None:
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", (ROOT / "README.md").read_text()))
    known = "".join(help_text(role, sub) for role, subs in SUBCOMMANDS.items() for sub in subs)
    assert sorted(f for f in named if f not in known) == []


def test_the_checker_sees_a_broken_anchor(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# Wi-Fi against `Ethernet`\n\n## Set up\n## Set up\n")
    assert anchors(page) == {"wi-fi-against-ethernet", "set-up", "set-up-1"}
