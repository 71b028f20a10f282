"""Choosing workers: compatibility, the fastest advertised, or the ones named.

A worker is named as ``HOST:PORT`` (no discovery) or by its Bonjour name,
or chosen automatically: among discovered workers that speak this protocol
version, offer the backend and share the target's vocabulary, the one with
the highest advertised draft speed.

Each lookup browses Bonjour afresh, unless it is given a ``live`` directory
that a long-running process (the server) keeps open: then it reads the
workers known now, and waits for one that fits only until the directory
has been open for the timeout (after that it is current).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from zeroconf import InterfaceChoice

from coordinator.workers.connection import WorkerConnection
from coordinator.workers.credentials import Credentials
from coordinator.workers.discovery import WorkerDirectory
from specwire.errors import (
    BackendUnavailableError,
    NoWorkerError,
    ProtocolVersionError,
)
from specwire.models.loading import LoadedModel
from specwire.models.vocab import ensure_same_vocabulary
from specwire.wire.bonjour import WorkerAdvert
from specwire.wire.protocol import BACKEND_PER_OP, BACKEND_STREAM, PROTOCOL_VERSION

SETTLE_S = 0.5  # after the first compatible answer
# A fresh browser's first query may go unanswered where several Bonjour stacks share port 5353 on one
# machine (each answer is unicast to the port, and only one of the sockets there receives it); python-
# zeroconf asks again after a second, and that query's answers are multicast. Measured on this project's
# VM with four workers on 127.0.0.1, twelve fresh browsers: the first answer came at 0.21 s in one and the
# others at 1.06-1.25 s in all. So choosing waits until this long after browsing began, within its timeout.
SECOND_QUERY_ANSWERED_S = 1.5
_HOST_PORT = re.compile(r"^\[?[\w.:-]+\]?:\d+$")


def check_worker(connection: WorkerConnection, target: LoadedModel, backend: str) -> None:
    """Raise unless the connected worker can draft for ``target`` over ``backend``."""
    check_hello(connection, target.fingerprint, target.spec, backend)


def check_hello(connection: WorkerConnection, fingerprint: str, target_name: str, backend: str) -> None:
    """Raise unless the connected worker's Hello says it can draft over ``backend`` for a target of
    vocabulary ``fingerprint`` (named ``target_name`` in the error): no target weights needed."""
    hello = connection.hello
    if hello.protocol_version != PROTOCOL_VERSION:
        raise ProtocolVersionError(
            f"worker {connection.name} speaks protocol version {hello.protocol_version}; "
            f"this coordinator speaks {PROTOCOL_VERSION}"
        )
    if backend not in hello.backends:
        why = ""
        if backend == BACKEND_PER_OP and hello.model.unwalked:
            why = f": {hello.model.unwalked}"
        raise BackendUnavailableError(
            f"worker {connection.name} does not offer the {backend} backend "
            f"(it offers {', '.join(hello.backends) or 'none'}){why}"
        )
    ensure_same_vocabulary(
        fingerprint, hello.model.fingerprint, target_name, f"{hello.model.spec} on worker {connection.name}"
    )


def incompatibility(
    advert: WorkerAdvert, fingerprint: str, backend: str, credentials: Credentials | None = None
) -> str | None:
    """Why ``advert`` cannot draft for this target, or None when it can."""
    auth, tls = advert.extra.get("auth", "none"), advert.extra.get("tls", "0")
    if credentials is not None and not credentials.insecure and auth != "token":
        return "advertises no authentication (possibly spoofed); pass --insecure to allow it"
    if credentials is not None and credentials.tls_ca is not None and tls != "1":
        return "does not serve TLS"
    if advert.protocol_version != PROTOCOL_VERSION:
        return f"protocol version {advert.protocol_version}, need {PROTOCOL_VERSION}"
    if backend not in advert.backends:
        return f"does not offer the {backend} backend (offers {', '.join(advert.backends) or 'none'})"
    if advert.fingerprint != fingerprint:
        return f"vocabulary {advert.fingerprint} differs from the target's {fingerprint}"
    if not advert.addresses:
        return "advertises no IPv4 address"
    return None


def choose(
    adverts: list[WorkerAdvert],
    fingerprint: str,
    backend: str,
    name: str | None = None,
    credentials: Credentials | None = None,
) -> WorkerAdvert:
    """The fastest compatible worker (or the one named), else ``NoWorkerError`` with every reason."""
    pool = [a for a in adverts if name is None or a.name == name]
    usable = [a for a in pool if incompatibility(a, fingerprint, backend, credentials) is None]
    if usable:
        return max(usable, key=lambda a: a.draft_tps)
    if name is not None and not pool:
        raise NoWorkerError(f"no worker named {name!r} answered on Bonjour")
    reasons = "; ".join(f"{a.name}: {incompatibility(a, fingerprint, backend, credentials)}" for a in pool)
    raise NoWorkerError(
        "no compatible worker found" + (f" ({reasons})" if reasons else " (none answered on Bonjour)")
    )


@asynccontextmanager
async def _browsing(
    interfaces: InterfaceChoice | list[str], live: WorkerDirectory | None
) -> AsyncIterator[tuple[WorkerDirectory, bool]]:
    """``live`` if given, else a fresh directory; and whether it is fresh (answers still arriving)."""
    if live is not None:
        yield live, False
        return
    async with WorkerDirectory(interfaces) as directory:
        yield directory, True


def is_address(selector: str) -> bool:
    """True for ``HOST:PORT`` selectors, which skip discovery."""
    return bool(_HOST_PORT.match(selector))


async def find_workers(
    selector: str | None,
    fingerprint: str,
    backend: str,
    interfaces: InterfaceChoice | list[str],
    timeout: float,
    credentials: Credentials | None = None,
    live: WorkerDirectory | None = None,
) -> list[str]:
    """The addresses to try, in order: ``selector`` itself if it is HOST:PORT, the worker it names, else
    every compatible worker discovered, fastest first (``NoWorkerError`` with every reason if none)."""
    if selector and is_address(selector):
        return [selector]
    if selector is None:
        ranked, seen = await ranked_workers(fingerprint, backend, interfaces, timeout, credentials, live=live)
        # each address once: adverts that outlived a worker may share its address with its new one
        return list(dict.fromkeys(w.address for w in ranked)) or [
            choose(seen, fingerprint, backend, None, credentials).address
        ]

    def found(workers: list[WorkerAdvert]) -> bool:
        return any(
            w.name == selector and incompatibility(w, fingerprint, backend, credentials) is None
            for w in workers
        )

    async with _browsing(interfaces, live) as (directory, _):
        await directory.wait_until(found, directory.wait_budget(timeout))
        return [choose(directory.workers(), fingerprint, backend, selector, credentials).address]


async def ranked_workers(
    fingerprint: str,
    backend: str,
    interfaces: InterfaceChoice | list[str],
    timeout: float,
    credentials: Credentials | None = None,
    exclude: frozenset[str] | set[str] = frozenset(),
    live: WorkerDirectory | None = None,
) -> tuple[list[WorkerAdvert], list[WorkerAdvert]]:
    """Compatible workers not named in ``exclude``, fastest first, and every worker that answered.

    Waits for the first compatible answer, then ``SETTLE_S`` more and until the browser's second query
    has been answered (``SECOND_QUERY_ANSWERED_S`` after browsing began, within ``timeout``), so the
    fastest is chosen rather than the first to answer.
    """

    def usable(workers: list[WorkerAdvert]) -> list[WorkerAdvert]:
        return [
            w
            for w in workers
            if w.name not in exclude and incompatibility(w, fingerprint, backend, credentials) is None
        ]

    async with _browsing(interfaces, live) as (directory, fresh):
        if await directory.wait_until(lambda ws: bool(usable(ws)), directory.wait_budget(timeout)) and fresh:
            second = directory.opened_at + SECOND_QUERY_ANSWERED_S - time.monotonic()
            await anyio.sleep(max(SETTLE_S, min(second, directory.wait_budget(timeout))))
        seen = directory.workers()
    return sorted(usable(seen), key=lambda w: -w.draft_tps), seen


async def find_addresses(
    selectors: list[str],
    fingerprint: str,
    interfaces: InterfaceChoice | list[str],
    timeout: float,
    credentials: Credentials,
    live: WorkerDirectory | None = None,
) -> list[str]:
    """Addresses of the workers to bench: HOST:PORT as given, names (or ``all``) through Bonjour."""
    addresses = [s for s in selectors if is_address(s)]
    names = [s for s in selectors if not is_address(s)]
    if not names:
        return addresses
    async with _browsing(interfaces, live) as (directory, fresh):
        if "all" in names:  # a fresh directory collects every answer for the whole timeout
            await directory.wait_until(lambda ws: bool(ws) and not fresh, directory.wait_budget(timeout))
        else:
            await directory.wait_until(
                lambda ws: set(names) <= {w.name for w in ws}, directory.wait_budget(timeout)
            )
        found = directory.workers()
    chosen = [w for w in found if "all" in names or w.name in names]
    missing = [n for n in names if n != "all" and n not in {w.name for w in found}]
    if missing:
        raise NoWorkerError(f"no worker named {', '.join(missing)} answered on Bonjour")
    usable = [w for w in chosen if incompatibility(w, fingerprint, BACKEND_STREAM, credentials) is None]
    if not usable and not addresses:
        reasons = "; ".join(
            f"{w.name}: {incompatibility(w, fingerprint, BACKEND_STREAM, credentials)}" for w in chosen
        )
        raise NoWorkerError("no compatible worker found" + (f" ({reasons})" if reasons else ""))
    return addresses + [w.address for w in usable]
