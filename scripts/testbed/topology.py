"""Names and addresses of the test bed: host namespaces joined by veth pairs to a bridge.

The bridge lives in a namespace of its own (the "switch"), so the machine's
own network namespace, interfaces and routes are never touched: every host,
the switch and every link exist only inside namespaces the test bed made.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

DEFAULT_WORKERS = ("m1-max", "m2-pro")
DEFAULT_COORDINATOR = "m2-ultra"
DEFAULT_SUBNET = "198.18.77.0/24"  # RFC 2544 benchmarking space
SWITCH = "specwire-switch"
BRIDGE = "br0"
HOST_IFACE = "eth0"


@dataclass(frozen=True)
class Host:
    """One emulated machine: a namespace with one interface on the bridge."""

    name: str
    address: str
    switch_port: str
    cpus: str = ""


@dataclass
class Topology:
    """Every host, the subnet, and the link settings."""

    subnet: str
    hosts: list[Host] = field(default_factory=list)
    rate: str = "1gbit"
    delay_ms: float = 0.15
    prefix: int = 24
    switch: str = SWITCH

    @classmethod
    def build(
        cls,
        names: list[str],
        subnet: str,
        rate: str,
        delay_ms: float,
        cpu_sets: list[str],
        switch: str = SWITCH,
    ) -> Topology:
        """Assign addresses (.1 for the first host, then .11, .12, …) and switch ports."""
        net = ipaddress.ip_network(subnet)
        offsets = [1] + [11 + i for i in range(len(names) - 1)]
        hosts = [
            Host(name, str(net.network_address + off), f"sw-{name}"[:15], cpus)
            for name, off, cpus in zip(names, offsets, cpu_sets, strict=True)
        ]
        return cls(
            subnet=subnet, hosts=hosts, rate=rate, delay_ms=delay_ms, prefix=net.prefixlen, switch=switch
        )

    def host(self, name: str) -> Host:
        """The host called ``name``."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def to_dict(self) -> dict:
        """Plain data for the state file."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Topology:
        """Back from the state file."""
        hosts = [Host(**h) for h in data.pop("hosts")]
        return cls(hosts=hosts, **data)


def cpu_sets(hosts: int, cpus: Sequence[int]) -> tuple[list[str], str]:
    """Disjoint sets of ``cpus`` (the CPUs this process may use) per host when there are enough; with
    fewer, the coordinator (the first host) a CPU of its own and the workers the rest, shared; and a
    note saying which. A set is written as taskset takes it ("0", "1,2,3")."""
    cpus = sorted(cpus)
    if len(cpus) < 2:
        return [""] * hosts, f"{len(cpus)} CPU shared by {hosts} hosts"
    if len(cpus) < hosts:
        rest = _listed(cpus[1:])
        note = f"the coordinator on CPU {cpus[0]}, the {hosts - 1} workers sharing CPU {rest} (fewer CPUs "
        note += "than hosts)"
        return [str(cpus[0]), *([rest] * (hosts - 1))], note
    share, extra = divmod(len(cpus), hosts)
    sets, start = [], 0
    for i in range(hosts):
        n = share + (1 if i < extra else 0)
        sets.append(_listed(cpus[start : start + n]))
        start += n
    return sets, "each host pinned to its own CPUs"


def _listed(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus)
