"""Model loading: GGUF files, mlx-lm directories and Hugging Face ids, behind one call."""

from __future__ import annotations

from specwire.models.loading import (
    DEFAULT_MODEL,
    LoadedModel,
    ModelSpec,
    load_model,
    load_tokenizer,
    vocabulary_fingerprint_of,
)

__all__ = [
    "DEFAULT_MODEL",
    "LoadedModel",
    "ModelSpec",
    "load_model",
    "load_tokenizer",
    "vocabulary_fingerprint_of",
]
