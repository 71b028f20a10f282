"""specwire: the library both roles share.

It holds what a coordinator (target machine) and a draft worker (drafting
machine) both need: model loading, the vocabulary fingerprint, draft sampling,
the drafter that runs a draft model against a KV cache, timing records, and
the domain errors. Role code lives in the ``coordinator`` and ``worker``
packages, never here.
"""

from __future__ import annotations

__version__ = "0.1.0"
