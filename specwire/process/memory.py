"""Resident memory of this process, as both roles report it."""

from __future__ import annotations

import os
import resource
import sys


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (ru_maxrss is bytes on macOS, KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def current_rss_bytes() -> int:
    """Resident set size now; 0 where the platform does not tell without extra packages."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
