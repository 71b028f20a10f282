"""Shared fixtures: the real default model, loaded once per test session."""

from __future__ import annotations

import pytest

from specwire.models import LoadedModel, load_model


@pytest.fixture(scope="session")
def default_q4() -> LoadedModel:
    """SmolLM2-135M-Instruct as stored: Q4_1 (token embedding Q8_0)."""
    return load_model("default")


@pytest.fixture(scope="session")
def default_f32() -> LoadedModel:
    """The same file dequantized to float32: the default target."""
    return load_model("default@float32")
