"""The test bed's commands: up, down, status and exec (the bench presets: ``testbed.bench``).

Links are shaped with tbf on both ends (the host's interface and its switch
port), so each direction of each link is limited to ``--rate``. Latency
comes from netem where the kernel has it (half the one-way delay on each
end of each link, so host to host is the full one-way delay); otherwise from
the project's delay relay, started next to each worker inside its host: the
worker listens on the host's loopback and advertises the relay, so
discovery itself leads through the delay.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed import state, system
from testbed.system import TestbedError, run
from testbed.topology import BRIDGE, HOST_IFACE, Host, Topology

SCRIPTS = Path(__file__).resolve().parents[1]
RELAY = SCRIPTS / "delay_relay.py"
PUBLIC_PORTS = (7070, 7071)  # what a worker behind the relay advertises: gRPC, echo
PRIVATE_PORTS = (57070, 57071)  # where it really listens, on the host's loopback
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$")


def rate_bits(rate: str) -> float:
    """``1gbit`` -> 1e9."""
    m = _RATE.match(rate.lower())
    if not m:
        raise TestbedError(f"rate {rate!r}: use a number with kbit, mbit or gbit, such as 1gbit")
    return float(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def _shape(netns: str, dev: str, topo: Topology, mechanism: str) -> None:
    bits = rate_bits(topo.rate)
    burst = max(int(bits / 8 * 0.002), 16 * 1024)  # 2 ms worth of traffic
    if mechanism == "netem":
        half = topo.delay_ms / 2
        run(
            "tc",
            "-n",
            netns,
            "qdisc",
            "add",
            "dev",
            dev,
            "root",
            "netem",
            "delay",
            f"{half}ms",
            "rate",
            topo.rate,
        )
    else:
        run(
            "tc",
            "-n",
            netns,
            "qdisc",
            "add",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            topo.rate,
            "burst",
            str(burst),
            "latency",
            "50ms",
        )


def _add_netns(name: str, record: dict) -> None:
    """Create a namespace and note it in the state at once, so a crash cannot orphan it."""
    run("ip", "netns", "add", name)
    record["namespaces"].append(name)
    state.save(record)


def _create(topo: Topology, mechanism: str, record: dict) -> None:
    sw = topo.switch
    _add_netns(sw, record)
    run("ip", "-n", sw, "link", "set", "lo", "up")
    run("ip", "-n", sw, "link", "add", BRIDGE, "type", "bridge")
    run("ip", "-n", sw, "link", "set", BRIDGE, "type", "bridge", "mcast_snooping", "0")
    run("ip", "-n", sw, "link", "set", BRIDGE, "up")
    for h in topo.hosts:
        _add_netns(h.name, record)
        run("ip", "-n", h.name, "link", "set", "lo", "up")
        veth = ["link", "add", HOST_IFACE, "type", "veth", "peer", "name", h.switch_port, "netns", sw]
        run("ip", "-n", h.name, *veth)
        # IPv4 only: no IPv6 link-local chatter on the test LAN.
        run(
            "ip",
            "netns",
            "exec",
            h.name,
            "sysctl",
            "-qw",
            f"net.ipv6.conf.{HOST_IFACE}.disable_ipv6=1",
            check=False,
        )
        run("ip", "-n", sw, "link", "set", h.switch_port, "master", BRIDGE, "up")
        run("ip", "-n", h.name, "addr", "add", f"{h.address}/{topo.prefix}", "dev", HOST_IFACE)
        run("ip", "-n", h.name, "link", "set", HOST_IFACE, "up")
        run("ip", "-n", h.name, "route", "add", "224.0.0.0/4", "dev", HOST_IFACE)  # mDNS stays on the bridge
        _shape(h.name, HOST_IFACE, topo, mechanism)
        _shape(sw, h.switch_port, topo, mechanism)


def _check_free(topo: Topology, ours: set[str]) -> None:
    """Refuse names or a subnet that exist and are not the test bed's own."""
    existing = system.namespaces()
    taken = [n for n in [topo.switch, *(h.name for h in topo.hosts)] if n in existing and n not in ours]
    if taken:
        raise TestbedError(
            f"network namespaces {', '.join(taken)} exist and are not this test bed's; refusing"
        )
    users = system.addresses_in(topo.subnet) + [
        f"{ns}: {a}" for ns in existing - ours for a in system.addresses_in(topo.subnet, ns)
    ]
    if users:
        raise TestbedError(
            f"subnet {topo.subnet} is already in use ({'; '.join(users)}); choose another with --subnet"
        )


def _teardown(names: list[str]) -> None:
    existing = system.namespaces()
    for ns in names:
        if ns in existing:
            _stop_processes(ns)
    for ns in names:
        if ns in existing:
            run("ip", "netns", "del", ns, check=False)


def _stop_processes(netns: str, grace_s: float = 10.0) -> None:
    """SIGTERM every process in ``netns``, then SIGKILL what is left."""
    for pid in system.pids_in(netns):
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while system.pids_in(netns) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in system.pids_in(netns):
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def up(topo: Topology, cpu_note: str) -> dict:
    """Create the test bed (or leave an identical one as it is); returns the state."""
    system.require_root()
    current = state.load()
    if current is not None and Topology.from_dict(dict(current["topology"])) == topo:
        missing = [n for n in current["namespaces"] if n not in system.namespaces()]
        if not missing:
            return current
    if current is not None:
        down()
    _check_free(topo, set())
    mechanism = "netem" if system.netem_available() else "relay"
    record: dict = {
        "topology": topo.to_dict(),
        "namespaces": [],
        "delay_mechanism": mechanism,
        "cpus": cpu_note,
    }
    state.save(record)
    try:
        _create(topo, mechanism, record)
        if mechanism == "relay" and len(topo.hosts) > 1:
            record["relay_cost_ms"] = _relay_cost_ms(topo)
            state.save(record)
    except BaseException:
        _teardown(record["namespaces"])
        state.clear()
        raise
    return record


CALIBRATION_PORTS = (47002, 47003)  # a relay, and the echo behind it


def _relay_cost_ms(topo: Topology) -> float:
    """The one-way latency the path has before the relay adds any delay: the link's and the relay's own.

    An echo behind a relay of no delay on a worker host is measured from the
    coordinator host (the median of small round trips, halved). Relays then
    add the configured delay less this, so a message takes the delay asked
    for from host to host, as it would on a LAN of that latency.
    """
    coordinator, host = topo.hosts[0], topo.hosts[1]
    relayed, hidden = CALIBRATION_PORTS
    serve = [sys.executable, str(RELAY), "--echo", f"127.0.0.1:{hidden}", "--delay-ms", "0"]
    serve += ["--map", f"{host.address}:{relayed}=127.0.0.1:{hidden}"]
    server = subprocess.Popen(["ip", "netns", "exec", host.name, *serve], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        server.stdout.readline()  # the ready line: listening
        measure = [sys.executable, str(RELAY), "--measure", f"{host.address}:{relayed}"]
        (through,) = json.loads(run("ip", "netns", "exec", coordinator.name, *measure).stdout)["rtt_p50_ms"]
    finally:
        server.terminate()
        server.wait(10)
    return through / 2


def down() -> list[str]:
    """Remove everything the test bed made, processes included; returns the namespaces removed."""
    system.require_root()
    current = state.load()
    if current is None:
        return []
    names = list(current["namespaces"])
    _teardown(names)
    state.clear()
    return names


def loaded() -> tuple[Topology, dict]:
    """The running test bed, or an error saying it is not up."""
    current = state.load()
    if current is None:
        raise TestbedError("the test bed is not up: run scripts/lan_testbed up")
    return Topology.from_dict(dict(current["topology"])), current


def status() -> str:
    """A readable description of the running test bed."""
    topo, current = loaded()
    relay = ""
    if "relay_cost_ms" in current:
        relay = f" (the path's own {current['relay_cost_ms']:.3f} ms a direction is taken off the delay)"
    lines = [
        f"subnet {topo.subnet}, rate {topo.rate} each way per link, one-way delay {topo.delay_ms} ms "
        f"via {current['delay_mechanism']}{relay}",
        f"CPUs: {current['cpus']}",
    ]
    existing = system.namespaces()
    for h in topo.hosts:
        qdisc = run("tc", "-n", h.name, "qdisc", "show", "dev", HOST_IFACE, check=False).stdout.split("\n")[0]
        pids = system.pids_in(h.name) if h.name in existing else []
        up_ = "up" if h.name in existing else "MISSING"
        pin = f", CPUs {h.cpus}" if h.cpus else ""
        lines.append(f"  {h.name:<10} {h.address:<15} {up_}{pin}; {qdisc.strip()}; processes {pids}")
    return "\n".join(lines)


def _is_worker_serve(command: list[str]) -> bool:
    names = [Path(c).name for c in command[:4]]
    return "serve" in command[1:4] and ("worker" in names or "worker.cli" in command)


def exec_in(host_name: str, command: list[str]) -> int:
    """Run ``command`` on a host: in its namespace, its CPUs, mDNS bound to its bridge address."""
    topo, current = loaded()
    host = topo.host(host_name)
    prefix = ["ip", "netns", "exec", host.name, "env", f"SPECWIRE_MDNS_INTERFACES={host.address}"]
    if host.cpus:
        prefix += ["taskset", "-c", host.cpus]
    if current["delay_mechanism"] == "relay" and _is_worker_serve(command):
        return _worker_behind_relay(host, topo, prefix, command)
    return _supervise([subprocess.Popen([*prefix, *command])])


def _worker_behind_relay(host: Host, topo: Topology, prefix: list[str], command: list[str]) -> int:
    """Start the relay that carries the host's delay, then the worker, listening behind it."""
    grpc_public, echo_public = PUBLIC_PORTS
    grpc_private, echo_private = PRIVATE_PORTS
    _, current = loaded()
    delay_ms = max(0.0, topo.delay_ms - float(current.get("relay_cost_ms", 0.0)))
    relay = subprocess.Popen(
        [
            *prefix,
            sys.executable,
            str(RELAY),
            "--delay-ms",
            str(delay_ms),
            "--map",
            f"{host.address}:{grpc_public}=127.0.0.1:{grpc_private}",
            "--map",
            f"{host.address}:{echo_public}=127.0.0.1:{echo_private}",
        ],
        stdout=subprocess.DEVNULL,
    )
    flags = [
        "--host",
        "127.0.0.1",
        "--port",
        str(grpc_private),
        "--echo-port",
        str(echo_private),
        "--advertise-host",
        host.address,
        "--advertise-port",
        str(grpc_public),
        "--advertise-echo-port",
        str(echo_public),
        "--interface",
        host.address,
    ]
    worker = subprocess.Popen([*prefix, *command, *flags])
    return _supervise([worker, relay])


def _supervise(processes: list[subprocess.Popen]) -> int:
    """Wait for the first process; pass SIGINT/SIGTERM on; stop the rest; return its exit code."""

    def forward(signum: int, _frame: object) -> None:
        for p in processes:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    code = processes[0].wait()
    for p in processes[1:]:
        if p.poll() is None:
            p.terminate()
            p.wait(10)
    return code
