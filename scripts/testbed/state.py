"""What the test bed made, remembered across commands (a root-owned file under /run)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_FILE = Path(os.environ.get("SPECWIRE_TESTBED_STATE", "/run/specwire-testbed.json"))


def load() -> dict[str, Any] | None:
    """The saved state, or None when no test bed is up."""
    try:
        return json.loads(STATE_FILE.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def save(state: dict[str, Any]) -> None:
    """Write the state (mode 0600)."""
    STATE_FILE.write_text(json.dumps(state, indent=2))
    STATE_FILE.chmod(0o600)


def clear() -> None:
    """Forget the test bed."""
    STATE_FILE.unlink(missing_ok=True)
