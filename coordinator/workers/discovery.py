"""Finding workers over Bonjour: a live directory, and one-shot browsing.

``WorkerDirectory`` keeps the set of ``_specwire._tcp`` services current: a
worker is added when it announces and resolves, updated when its TXT record
changes, and dropped on its goodbye or when its records expire.

zeroconf calls the browser's handler from a plain event-loop callback, not
from a task, where anyio cannot tell which library runs it (with sniffio
installed, creating an anyio task or event there fails). So the handler only
queues the change, on a memory stream; a task of the directory's own applies
it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from types import TracebackType

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from zeroconf import InterfaceChoice, IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from specwire.wire.bonjour import SERVICE_TYPE, WorkerAdvert, instance_name, open_zeroconf

log = logging.getLogger(__name__)
RESOLVE_TIMEOUT_MS = 3000


class WorkerDirectory:
    """``async with WorkerDirectory(interfaces) as d``: the workers on Bonjour, kept current."""

    def __init__(self, interfaces: InterfaceChoice | list[str]) -> None:
        self.interfaces = interfaces
        self._workers: dict[str, WorkerAdvert] = {}
        self._changed = anyio.Event()
        self._zc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._tg: TaskGroup | None = None
        self._changes: MemoryObjectSendStream[tuple[ServiceStateChange, str]] | None = None
        self._epochs: dict[str, int] = {}  # goodbyes seen per service name
        self.opened_at = float("inf")  # time.monotonic() when browsing began

    def wait_budget(self, timeout: float) -> float:
        """What is left of ``timeout`` counted from when browsing began: an old directory is current."""
        return max(0.0, self.opened_at + timeout - time.monotonic())

    def workers(self) -> list[WorkerAdvert]:
        """The workers known now, by name."""
        return [self._workers[name] for name in sorted(self._workers)]

    async def wait_until(self, predicate: Callable[[list[WorkerAdvert]], bool], timeout: float) -> bool:
        """Wait until ``predicate(workers)`` holds; False if ``timeout`` passes first."""
        with anyio.move_on_after(timeout):
            while not predicate(self.workers()):
                await self._changed.wait()
            return True
        return False

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def _on_change(
        self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        if self._changes is not None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._changes.send_nowait((state_change, name))

    async def _apply(self, changes: MemoryObjectReceiveStream[tuple[ServiceStateChange, str]]) -> None:
        assert self._tg is not None
        async for state_change, name in changes:
            if state_change is not ServiceStateChange.Removed:
                self._tg.start_soon(self._resolve, name, self._epochs.get(name, 0))
                continue
            self._epochs[name] = self._epochs.get(name, 0) + 1  # a resolve still running must not re-add it
            if self._workers.pop(instance_name(name), None) is not None:
                log.info("worker %s left", instance_name(name))
                self._notify()

    async def _resolve(self, name: str, epoch: int) -> None:
        """Resolve one announcement; anything wrong with it is logged, never raised into the directory."""
        assert self._zc is not None
        try:
            info = AsyncServiceInfo(SERVICE_TYPE, name)
            if not await info.async_request(self._zc.zeroconf, RESOLVE_TIMEOUT_MS):
                log.info("could not resolve %s", name)
                return
            advert = WorkerAdvert.from_txt(
                name, info.parsed_addresses(IPVersion.V4Only), info.port or 0, dict(info.properties)
            )
        except Exception as err:  # a malformed advertisement from anyone on the LAN
            log.warning("ignoring the advertisement %r: %s", name, err)
            return
        if self._epochs.get(name, 0) != epoch:
            return  # it left while being resolved
        self._workers[advert.name] = advert
        log.info("worker %s at %s", advert.name, advert.address)
        self._notify()

    async def __aenter__(self) -> WorkerDirectory:
        self.opened_at = time.monotonic()
        self._zc = open_zeroconf(self.interfaces)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._changes, changes = anyio.create_memory_object_stream[tuple[ServiceStateChange, str]](math.inf)
        self._tg.start_soon(self._apply, changes)
        self._browser = AsyncServiceBrowser(self._zc.zeroconf, [SERVICE_TYPE], handlers=[self._on_change])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._zc is not None and self._tg is not None and self._browser is not None
        try:
            await self._browser.async_cancel()
            if self._changes is not None:
                self._changes.close()
                self._changes = None
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)
        finally:
            await self._zc.async_close()


async def browse(interfaces: InterfaceChoice | list[str], timeout: float) -> list[WorkerAdvert]:
    """The workers that answer within ``timeout`` seconds."""
    async with WorkerDirectory(interfaces) as directory:
        await anyio.sleep(timeout)
        return directory.workers()
