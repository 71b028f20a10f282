"""Every measurement in ``scripts/measure/`` names, in its docstring, the docs/ section its figure feeds,
and that section exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.test_guide import anchors

ROOT = Path(__file__).resolve().parents[3]
MEASUREMENTS = sorted(p for p in (ROOT / "scripts" / "measure").glob("*.py") if p.name != "__init__.py")
SECTION = re.compile(r"docs/([\w-]+\.md)#([\w-]+)")


def test_there_are_measurements() -> None:
    assert len(MEASUREMENTS) >= 10


@pytest.mark.parametrize("script", MEASUREMENTS, ids=lambda p: p.name)
def test_the_docstring_names_a_section_that_exists(script: Path) -> None:
    sections = SECTION.findall(ast.get_docstring(ast.parse(script.read_text())) or "")
    assert sections, f"{script.name} names no docs/FILE.md#section"
    for page, anchor in sections:
        assert anchor in anchors(ROOT / "docs" / page), f"{script.name}: no #{anchor} in docs/{page}"
