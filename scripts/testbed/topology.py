"""Names and addresses of the test bed: host namespaces joined by veth pairs to a bridge.

The bridge lives in a namespace of its own (the "switch"), so the machine's
own network namespace, interfaces and routes are never touched: every host,
the switch and every link exist only inside namespaces the test bed made.
"""

from __future__ import annotations

import ipaddress
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


def cpu_sets(hosts: int, cores: int) -> tuple[list[str], str]:
    """Disjoint CPU sets per host when there are enough cores; with fewer, the coordinator (the first
    host) a CPU of its own and the workers the rest, shared; and a note saying which."""
    if cores < 2:
        return [""] * hosts, f"{cores} CPU shared by {hosts} hosts"
    if cores < hosts:
        rest = f"1-{cores - 1}" if cores > 2 else "1"
        note = f"the coordinator on CPU 0, the {hosts - 1} workers sharing CPU {rest} (fewer CPUs than hosts)"
        return ["0", *([rest] * (hosts - 1))], note
    share, extra = divmod(cores, hosts)
    sets, start = [], 0
    for i in range(hosts):
        n = share + (1 if i < extra else 0)
        sets.append(f"{start}-{start + n - 1}" if n > 1 else str(start))
        start += n
    return sets, "each host pinned to its own CPUs"
