"""Shared fixtures: the real default model, loaded once per test session."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from specwire.auth import TOKEN_ENV
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
def test_environment(tmp_path_factory: pytest.TempPathFactory) -> None:
    """What every test and its subprocesses share.

    mDNS stays on 127.0.0.1; workers and coordinators share a token of this
    session; the user's real config directory is never read or written.
    """
    os.environ["SPECWIRE_MDNS_INTERFACES"] = "127.0.0.1"
    os.environ[TOKEN_ENV] = secrets.token_urlsafe(32)
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))


@pytest.fixture
def anyio_backend() -> str:
    """grpc.aio and AsyncZeroconf need asyncio."""
    return "asyncio"


@pytest.fixture(scope="session")
def worker() -> Iterator[WorkerProcess]:
    """One real worker serving the default model, shared by the tests that only read from it."""
    with running_worker("--name", unique_name("test-worker"), "--label", "M1 Max (test)") as w:
        yield w
