"""Resident memory of this process, as both roles report it, and the cyclic collector off the timed path."""

from __future__ import annotations

import gc
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


def settle_heap() -> None:
    """Collect every generation (what an earlier call froze included), then freeze what is alive now.

    Python's cyclic collector scans every object it tracks in a full collection, and a process that
    has loaded mlx-lm, gRPC and a model holds enough of them for that to take 43-196 ms on the
    development VM (docs/measurements.md#collector-pauses), paid inside whichever round or paced pass it
    falls in. Frozen objects (``gc.freeze``) are left out of every collection. Call it once a process is
    warm, and before each timed run of a bench: what died since is collected first, cycles included.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
