"""Running ``ip`` and ``tc``, and finding what already exists on this machine."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess


class TestbedError(Exception):
    """The test bed cannot do what was asked; the message says why."""


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, raising ``TestbedError`` with its output when it fails."""
    result = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise TestbedError(f"{' '.join(args)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def require_root() -> None:
    """The test bed manages namespaces and qdiscs: root and iproute2 only."""
    if os.geteuid() != 0:
        raise TestbedError("the LAN test bed needs root (network namespaces, veth pairs, tc)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise TestbedError(f"{tool} not found: install iproute2")


def namespaces() -> set[str]:
    """Names of the network namespaces that exist."""
    out = run("ip", "-json", "netns", "list", check=False).stdout.strip()
    return {n["name"] for n in json.loads(out)} if out else set()


def addresses_in(subnet: str, netns: str | None = None) -> list[str]:
    """Interface addresses inside ``subnet`` (in ``netns``, or the machine's own namespace)."""
    net = ipaddress.ip_network(subnet)
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    out = run(*prefix, "-json", "addr", "show", check=False).stdout.strip()
    found = []
    for link in json.loads(out) if out else []:
        for info in link.get("addr_info", []):
            if info.get("family") == "inet" and ipaddress.ip_address(info["local"]) in net:
                found.append(f"{link['ifname']} {info['local']}")
    return found


def pids_in(netns: str) -> list[int]:
    """Processes running in ``netns``."""
    out = run("ip", "netns", "pids", netns, check=False).stdout.split()
    return [int(p) for p in out]


def netem_available() -> bool:
    """Whether the kernel has netem (tried in a scratch namespace, never on a real interface)."""
    scratch = "specwire-netem-probe"
    run("ip", "netns", "add", scratch, check=False)
    try:
        run("ip", "-n", scratch, "link", "set", "lo", "up", check=False)
        ok = run(
            "tc", "-n", scratch, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", check=False
        )
        return ok.returncode == 0
    finally:
        run("ip", "netns", "del", scratch, check=False)
