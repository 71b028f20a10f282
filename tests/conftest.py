"""Shared fixtures: the models and the workers, each loaded or started once per test session.

Two model pairs serve the suite. The real default model (``default_q4``,
``default_f32``, ``worker``) is for tests whose point is its output: lossless
decoding, the GGUF loader, the user's path. The ``tiny`` model (``tiny``,
``tiny_worker``; ``specwire.models.tiny``) has the same tokenizer and
vocabulary and takes about 1.5 ms a pass; it is for tests of protocol,
parsing, auth, discovery and orchestration.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
from anyio.pytest_plugin import get_runner

from specwire.models.loading import LoadedModel, load_model
from specwire.wire.auth import TOKEN_ENV
from tests.support.processes.isolation import can_isolate, enter_own_network_namespace
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name

PARALLEL_PROCESSES = 3  # on 2 cores: most tests wait on worker processes, and timing tests run alone


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (make test): three processes where each can have a loopback of its own, else one."""
    return PARALLEL_PROCESSES if can_isolate() else 0


def pytest_configure(config: pytest.Config) -> None:
    """A process started by pytest-xdist moves into its own network namespace before any test."""
    if hasattr(config, "workerinput"):
        enter_own_network_namespace()


@pytest.fixture(scope="session")
def default_q4() -> LoadedModel:
    """SmolLM2-135M-Instruct as stored: Q4_1 (token embedding Q8_0)."""
    return load_model("default")


@pytest.fixture(scope="session")
def default_f32() -> LoadedModel:
    """The same file dequantized to float32: the default target."""
    return load_model("default@float32")


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    """The fast protocol-measurement model (random weights, the default model's tokenizer)."""
    return load_model("tiny")


@pytest.fixture(scope="session", autouse=True)
def one_event_loop() -> Iterator[None]:
    """Every async test runs on one asyncio event loop, held for the whole session.

    grpc.aio polls completions on a thread of its own and hands them to the
    loop that made the call; with a fresh loop per test, a late completion of
    an earlier test's call can land on a closed loop and fail an unrelated
    test ("Event loop is closed"). Holding the anyio test runner open keeps
    one loop alive from the first async test to the last.
    """
    with get_runner("asyncio", {}):
        yield


@pytest.fixture(scope="session", autouse=True)
def test_environment(tmp_path_factory: pytest.TempPathFactory) -> None:
    """What every test and its subprocesses share.

    mDNS stays on 127.0.0.1; workers and coordinators share a token of this
    session; the user's real config directory is never read or written.
    """
    os.environ["SPECWIRE_MDNS_INTERFACES"] = "127.0.0.1"
    os.environ[TOKEN_ENV] = secrets.token_hex(32)  # as create_token makes them: never a leading "-"
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


@pytest.fixture(scope="session")
def tiny_worker() -> Iterator[WorkerProcess]:
    """One real worker serving the tiny model, for tests of protocol, auth and orchestration."""
    with running_worker(
        "--model", "tiny", "--name", unique_name("tiny-worker"), "--label", "M1 Max (tiny)"
    ) as w:
        yield w
