"""Announcing a worker over Bonjour, and saying goodbye when it stops.

Registration is awaited until probing has settled the name: from then on
the worker answers queries, so it is ready; its three announcements go out
over the next second or so in the background (about 0.9 s of start-up
saved) and are awaited before the goodbye. Unregistration is awaited to
completion (the packets sent), so a stopping worker really sends its
goodbye and running browsers drop it at once. Records carry a 120 s TTL,
so a worker that dies without a goodbye leaves browsers' caches within two
minutes.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Awaitable
from types import TracebackType

import ifaddr
from zeroconf import InterfaceChoice
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from specwire.wire.bonjour import SERVICE_TYPE, WorkerAdvert, open_zeroconf

log = logging.getLogger(__name__)
RECORD_TTL_S = 120


def advertised_addresses(
    advertise_host: str | None, interfaces: InterfaceChoice | list[str], bind_host: str
) -> list[str]:
    """The IPv4 addresses coordinators should connect to."""
    if advertise_host:
        return [socket.gethostbyname(advertise_host)]
    if isinstance(interfaces, list):
        return list(interfaces)
    if bind_host not in ("", "0.0.0.0", "::"):
        return [socket.gethostbyname(bind_host)]
    found = [
        ip.ip
        for adapter in ifaddr.get_adapters()
        for ip in adapter.ips
        if isinstance(ip.ip, str) and not ip.ip.startswith("127.")
    ]
    return found or ["127.0.0.1"]


class Advertiser:
    """``async with Advertiser(advert, interfaces)``: registered inside, goodbye on exit."""

    def __init__(self, advert: WorkerAdvert, interfaces: InterfaceChoice | list[str]) -> None:
        self.advert = advert
        self.interfaces = interfaces
        self._zc: AsyncZeroconf | None = None
        self._info: AsyncServiceInfo | None = None
        self._announcing: Awaitable[object] | None = None

    @property
    def name(self) -> str:
        """The registered instance name (Bonjour may have renamed it on a conflict)."""
        if self._info is None:
            return self.advert.name
        return self._info.name[: -len(SERVICE_TYPE) - 1]

    async def __aenter__(self) -> Advertiser:
        self._zc = open_zeroconf(self.interfaces)
        # The SRV target names this worker, not just the machine: workers that share a
        # hostname (two on one Mac, or test-bed namespaces) must not share address records.
        machine = socket.gethostname().split(".")[0] or "specwire"
        host_label = re.sub(r"[^A-Za-z0-9-]+", "-", f"{machine}-{self.advert.name}").strip("-")[:63]
        self._info = AsyncServiceInfo(
            SERVICE_TYPE,
            f"{self.advert.name}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(a) for a in self.advert.addresses],
            port=self.advert.port,
            properties=self.advert.txt(),
            server=f"{host_label}.local.",
            host_ttl=RECORD_TTL_S,
            other_ttl=RECORD_TTL_S,
        )
        self._announcing = await self._zc.async_register_service(self._info, allow_name_change=True)
        log.info("advertised %s on %s", self.name, self.advert.addresses)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._zc is not None and self._info is not None
        try:
            if self._announcing is not None:
                await self._announcing
            await (await self._zc.async_unregister_service(self._info))
            log.info("sent Bonjour goodbye for %s", self.name)
        finally:
            await self._zc.async_close()
