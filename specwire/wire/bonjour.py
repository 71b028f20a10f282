"""What a worker advertises over Bonjour (mDNS/DNS-SD), and how both sides read it.

Workers register ``_specwire._tcp.local.``; the TXT record carries the
protocol version, the backends offered, the model, the vocabulary
fingerprint, the operator's label and the measured draft speed, so a
coordinator can pick a compatible worker before connecting. Secrets never go
in TXT.

mDNS is bound to explicit interfaces when asked (``--interface`` or the
``SPECWIRE_MDNS_INTERFACES`` environment variable); tests and scripts bind it
to 127.0.0.1 or to their own test bridge. IPv4 only.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from zeroconf import InterfaceChoice, IPVersion
from zeroconf.asyncio import AsyncZeroconf

from specwire.errors import BonjourUnavailableError, InvalidArgumentError

SERVICE_TYPE = "_specwire._tcp.local."
INTERFACES_ENV = "SPECWIRE_MDNS_INTERFACES"
TXT_VALUE_LIMIT = 200


@dataclass(frozen=True)
class WorkerAdvert:
    """A worker as Bonjour describes it."""

    name: str
    addresses: tuple[str, ...]
    port: int
    protocol_version: int
    backends: tuple[str, ...]
    model: str
    fingerprint: str
    label: str = ""
    draft_tps: float = 0.0
    host: str = ""
    pid: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        """``host:port`` of the first advertised address."""
        return f"{self.addresses[0]}:{self.port}" if self.addresses else f"?:{self.port}"

    def txt(self) -> dict[str, str]:
        """The TXT record properties of this advert."""
        props = {
            "pv": str(self.protocol_version),
            "backends": ",".join(self.backends),
            "model": self.model[:TXT_VALUE_LIMIT],
            "fp": self.fingerprint,
            "label": self.label[:TXT_VALUE_LIMIT],
            "tps": f"{self.draft_tps:.2f}",
            "host": self.host[:TXT_VALUE_LIMIT],
            "pid": str(self.pid),
        }
        return {**props, **self.extra}

    @classmethod
    def from_txt(
        cls, name: str, addresses: list[str], port: int, props: dict[bytes, bytes | None]
    ) -> WorkerAdvert:
        """Parse a resolved service; unknown keys land in ``extra``, bad numbers become 0."""
        text = {k.decode(errors="replace"): (v or b"").decode(errors="replace") for k, v in props.items()}
        known = {"pv", "backends", "model", "fp", "label", "tps", "host", "pid"}
        return cls(
            name=instance_name(name),
            addresses=tuple(addresses),
            port=port,
            protocol_version=_int(text.get("pv")),
            backends=tuple(b for b in text.get("backends", "").split(",") if b),
            model=text.get("model", ""),
            fingerprint=text.get("fp", ""),
            label=text.get("label", ""),
            draft_tps=_float(text.get("tps")),
            host=text.get("host", ""),
            pid=_int(text.get("pid")),
            extra={k: v for k, v in text.items() if k not in known},
        )


def instance_name(full_name: str) -> str:
    """``m1-max._specwire._tcp.local.`` -> ``m1-max``."""
    return full_name[: -len(SERVICE_TYPE) - 1] if full_name.endswith("." + SERVICE_TYPE) else full_name


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def _float(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


def mdns_interfaces(arg: str | None) -> InterfaceChoice | list[str]:
    """Interfaces for zeroconf: ``all``, or comma-separated IPv4 addresses.

    Without an argument the ``SPECWIRE_MDNS_INTERFACES`` environment variable
    decides, and without that, all interfaces.
    """
    value = arg if arg is not None else os.environ.get(INTERFACES_ENV, "all")
    if value.strip().lower() in ("", "all"):
        return InterfaceChoice.All
    addresses = [a.strip() for a in value.split(",") if a.strip()]
    for a in addresses:
        try:
            socket.inet_aton(a)
        except OSError as err:
            raise InvalidArgumentError(f"mDNS interface {a!r} is not an IPv4 address (or 'all')") from err
    return addresses


def open_zeroconf(interfaces: InterfaceChoice | list[str]) -> AsyncZeroconf:
    """Zeroconf (IPv4) on ``interfaces``, or ``BonjourUnavailableError`` saying why it cannot be.

    Joining the mDNS multicast group fails on a host whose interfaces are down
    or refuse multicast; that is a set-up problem, reported in one line.
    """
    try:
        return AsyncZeroconf(interfaces=interfaces, ip_version=IPVersion.V4Only)
    except OSError as err:
        where = "every interface" if interfaces == InterfaceChoice.All else ", ".join(interfaces)  # type: ignore[arg-type]
        raise BonjourUnavailableError(
            f"cannot use Bonjour (mDNS) on {where}: {err}; choose an interface that is up "
            "(--interface ADDRESS), or give workers as HOST:PORT"
        ) from err
