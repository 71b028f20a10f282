"""Shared fixtures: the real default model, loaded once per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from specwire.models import LoadedModel, load_model
from tests.support.workers import WorkerProcess, running_worker, unique_name


@pytest.fixture(scope="session")
def default_q4() -> LoadedModel:
    """SmolLM2-135M-Instruct as stored: Q4_1 (token embedding Q8_0)."""
    return load_model("default")


@pytest.fixture(scope="session")
def default_f32() -> LoadedModel:
    """The same file dequantized to float32: the default target."""
    return load_model("default@float32")


@pytest.fixture(scope="session", autouse=True)
def mdns_on_loopback() -> None:
    """Every mDNS socket a test (or its subprocesses) opens stays on 127.0.0.1."""
    os.environ["SPECWIRE_MDNS_INTERFACES"] = "127.0.0.1"


@pytest.fixture
def anyio_backend() -> str:
    """grpc.aio and AsyncZeroconf need asyncio."""
    return "asyncio"


@pytest.fixture(scope="session")
def worker() -> Iterator[WorkerProcess]:
    """One real worker serving the default model, shared by the tests that only read from it."""
    with running_worker("--name", unique_name("test-worker"), "--label", "M1 Max (test)") as w:
        yield w
