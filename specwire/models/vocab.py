"""The vocabulary fingerprint: a stable hash that two machines can compare.

Speculative decoding only works when draft and target map ids to the same
strings. The fingerprint hashes every token string in id order (as the
tokenizer spells it, so a GGUF file and the mlx-lm directory converted from
the same tokenizer agree) plus the BOS and EOS ids. Two models with equal
fingerprints can draft for each other; the check runs before any drafting,
locally and across the wire.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from specwire.errors import VocabularyMismatchError

FINGERPRINT_VERSION = "v1"


def vocabulary_fingerprint(tokenizer: Any) -> str:
    """Return ``v1:<16 hex>`` for a Hugging Face or mlx-lm tokenizer."""
    size = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    digest = hashlib.sha256()
    for token in tokens:
        digest.update((token if token is not None else "").encode("utf-8"))
        digest.update(b"\0")
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    special = {"size": size, "bos": tokenizer.bos_token_id, "eos": eos}
    digest.update(json.dumps(special, sort_keys=True).encode())
    return f"{FINGERPRINT_VERSION}:{digest.hexdigest()[:16]}"


def ensure_same_vocabulary(target_fp: str, draft_fp: str, target_name: str, draft_name: str) -> None:
    """Raise ``VocabularyMismatchError`` unless the two fingerprints are equal."""
    if target_fp != draft_fp:
        raise VocabularyMismatchError(
            f"draft {draft_name} (vocabulary {draft_fp}) and target {target_name} "
            f"(vocabulary {target_fp}) tokenize differently; "
            "speculative decoding needs one vocabulary"
        )
