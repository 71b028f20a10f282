"""The generated gRPC code is what scripts/gen_proto.py makes from proto/ today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr


def test_every_message_and_field_is_commented() -> None:
    lines = (ROOT / "proto" / "specwire" / "v1" / "draft.proto").read_text().splitlines()
    for i, line in enumerate(lines):
        text = line.strip()
        declares = text.startswith(("message ", "rpc ", "service ", "oneof ")) or (
            text.endswith(";") and "=" in text and not text.startswith(("syntax", "package", "option"))
        )
        if declares:
            assert lines[i - 1].strip().startswith("//"), f"line {i + 1} has no comment: {text}"
