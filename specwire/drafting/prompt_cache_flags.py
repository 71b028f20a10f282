"""The prompt cache's flags, ``--prompt-cache-size`` and ``--prompt-cache-bytes``, shared by ``worker
serve`` and ``coordinator serve`` and named as mlx_lm.server names them.

Kept apart from ``specwire.drafting.prefix_cache`` (the cache itself) so that a command's flags are read
without loading mlx-lm.
"""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_ENTRIES = 10
DEFAULT_BYTES = 2 << 30


def parse_bytes(text: str) -> int:
    """``4294967296``, ``4G``, ``512M`` or ``64K`` as bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().removesuffix("B")
    scale = units.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in units else text
    try:
        value = int(float(number) * scale)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 4294967296, 4G or 512M") from err
    if value < 0:
        raise argparse.ArgumentTypeError("a size cannot be negative")
    return value


def add_prompt_cache_arguments(group: Any) -> None:
    """``--prompt-cache-size`` and ``--prompt-cache-bytes``, named as mlx_lm.server names them."""
    group.add_argument(
        "--prompt-cache-size",
        type=int,
        default=DEFAULT_ENTRIES,
        help="prompts whose prefill is kept for later requests that start the same (0: none)",
    )
    group.add_argument(
        "--prompt-cache-bytes",
        type=parse_bytes,
        default=DEFAULT_BYTES,
        help="most bytes each model's prompt cache holds, such as 4G (least recently used out first)",
    )
