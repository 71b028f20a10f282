"""A progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``with Progress(total) as p: p.step("label")``."""

    def __init__(self, total: int, stream: TextIO = sys.stderr, width: int = 28) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self.width = width
        self.started = time.monotonic()
        self.tty = stream.isatty()

    def step(self, label: str) -> None:
        """Announce the step about to run."""
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.monotonic() - self.started
        line = f"[{bar}] {self.done}/{self.total} {elapsed:5.0f}s  {label}"
        if self.tty:
            self.stream.write("\r" + line[:120].ljust(120))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.done += 1

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.tty:
            self.stream.write("\n")
        self.stream.write(
            f"bench finished {self.done}/{self.total} runs in {time.monotonic() - self.started:.0f}s\n"
        )
        self.stream.flush()
