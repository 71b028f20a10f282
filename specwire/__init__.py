"""specwire: the library both roles share, grouped by purpose.

* ``models``: loading a model (GGUF files, mlx-lm directories, Hugging Face
  ids, the bundled default and the tiny test models), the vocabulary
  fingerprint both ends compare, and the operations of a pass the per-op
  baseline walks;
* ``drafting``: a draft model against its KV cache (the drafter, its blocks
  and sampling), rolling a cache back, and drafting ahead (pre-speculation's
  branches, the tree of continuations, their batched passes);
* ``wire``: what travels between the roles: the protocol messages'
  conversions, timing records, the shared-token proofs, Bonjour's record
  and the LAN probe's echo frames (``v1`` holds the generated gRPC code);
* ``emulation``: hardware profiles (the paper's Macs, or a file) and paced
  compute, which holds a process's passes to a profiled machine's time;
* ``process``: what any process of either role runs on: the compute thread,
  the command line's way out, memory readings;
* ``errors``: the domain exceptions, in one module.

Role code lives in the ``coordinator`` and ``worker`` packages, never here.
"""

from __future__ import annotations

__version__ = "0.1.0"
