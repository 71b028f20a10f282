"""Shared fixtures: the models and the workers, each loaded or started once per test session.

Two model pairs serve the suite. The real default model (``default_q4``,
``default_f32``, ``worker``) is for tests whose point is its output: lossless
decoding, the GGUF loader, the user's path. The ``tiny`` model (``tiny``,
``tiny_worker``; ``specwire.models.tiny``) has the same tokenizer and
vocabulary and takes about 1.5 ms a pass; it is for tests of protocol,
parsing, auth, discovery and orchestration.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.pytest_plugin import get_runner

from specwire.models.loading import LoadedModel, load_model
from specwire.wire.auth import TOKEN_ENV
from tests.support.processes.isolation import can_isolate, enter_own_network_namespace
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name

SUITE_SIZE = pytest.StashKey[int]()
# The default model loaded in the test process: the files that take it run in one process (loadfile).
DEFAULT_MODEL_FIXTURES = frozenset({"default_q4", "default_f32"})
DEFAULT_MODEL = re.compile(r"\bdefault_(q4|f32)\b")
SERIAL = re.compile(r"\bpytest\.mark\.serial\b")  # how a file marks its timing tests
PARALLEL_PROCESSES = 3  # on 2 cores: most tests wait on worker processes, and timing tests run alone


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (make test): three processes where each can have a loopback of its own, else one."""
    return PARALLEL_PROCESSES if can_isolate() else 0


def pytest_configure(config: pytest.Config) -> None:
    """A process started by pytest-xdist moves into its own network namespace before any test."""
    if hasattr(config, "workerinput"):
        enter_own_network_namespace()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Count the suite, before ``-m`` or ``-k`` deselect any test, when this session collected all of it;
    check that every test of the default model is in a file the scheduler groups."""
    if config.args_source is pytest.Config.ArgsSource.TESTPATHS:
        config.stash[SUITE_SIZE] = len(items)
    grouped = default_model_files(config.rootpath)
    serial = files_naming(config.rootpath, SERIAL)
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if DEFAULT_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())) and path not in grouped:
            raise pytest.UsageError(f"{path} uses the default model but does not name it ({DEFAULT_MODEL})")
        if item.get_closest_marker("serial") and path not in serial:
            raise pytest.UsageError(f"{path} marks a test serial without writing {SERIAL.pattern}")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``-m serial`` (make test's timing tests) imports only the test files that mark a test serial;
    the others hold none, and importing them costs about 10 s of CPU."""
    if config.getoption("markexpr") != "serial" or not collection_path.is_file():
        return None
    path = collection_path.relative_to(config.rootpath).as_posix()
    return collection_path.name.startswith("test_") and path not in files_naming(config.rootpath, SERIAL)


def default_model_files(root: Path) -> frozenset[str]:
    """The test files (paths as in node ids) that name the default model's fixtures."""
    return files_naming(root, DEFAULT_MODEL)


@functools.cache
def files_naming(root: Path, pattern: re.Pattern[str]) -> frozenset[str]:
    """The test files (paths as in node ids) whose text matches ``pattern``."""
    return frozenset(
        path.relative_to(root).as_posix()
        for path in (root / "tests").rglob("test_*.py")
        if pattern.search(path.read_text())
    )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the files of the default model as one unit (``FileScheduling``)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """Each test file is a unit of work, as ``loadfile`` makes it, but the files that load the
        default model in-process are one unit: its two precisions load, and its greedy references
        (``tests/support/prompts``) are computed, once a run instead of once in each process."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return DEFAULT_MODEL.pattern if path in default_model_files(config.rootpath) else path

    return FileScheduling(config, log)


@pytest.fixture(scope="session")
def suite_size(request: pytest.FixtureRequest) -> int | None:
    """How many tests the whole suite holds, if this session collected all of it (``make test`` does)."""
    return request.config.stash.get(SUITE_SIZE, None)


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
