"""``scripts/lan_testbed``: an emulated three-host LAN on one Linux machine (root only).

lan_testbed up [--rate 1gbit] [--delay 0.15ms] [--cpus] [--workers m1-max,m2-pro] [--coordinator m2-ultra]
lan_testbed status
lan_testbed exec m1-max -- worker serve --label "M1 Max"
lan_testbed bench [--rate …] [--delay …] [--profile paper [--family hybrid] [--machines m1-max,m1-max,…]]
                  [-- coordinator bench flags]
lan_testbed down
"""

from __future__ import annotations

import argparse
import os
import sys

from specwire.emulation.paper import PAIRS, load_profile
from specwire.errors import SpecwireError
from testbed import bench as presets
from testbed import commands
from testbed.system import TestbedError
from testbed.topology import DEFAULT_COORDINATOR, DEFAULT_SUBNET, DEFAULT_WORKERS, SWITCH, Topology, cpu_sets


def _delay_ms(text: str) -> float:
    value = text.strip().lower()
    scale = 1.0
    if value.endswith("us"):
        value, scale = value[:-2], 0.001
    elif value.endswith("ms"):
        value = value[:-2]
    elif value.endswith("s"):
        value, scale = value[:-1], 1000.0
    try:
        return float(value) * scale
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"delay {text!r}: use a time such as 0.15ms or 1ms") from err


def _link_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rate", default="1gbit", help="bandwidth of each link, each way (tbf)")
    p.add_argument(
        "--delay",
        type=_delay_ms,
        default=0.15,
        help="one-way delay between hosts (netem, else the delay relay)",
    )
    p.add_argument(
        "--cpus",
        action="store_true",
        help="pin each host's processes to CPUs of its own (with fewer CPUs than hosts: the coordinator "
        "one, the workers the rest); bench --profile always pins",
    )
    p.add_argument("--workers", default=",".join(DEFAULT_WORKERS), help="worker host names")
    p.add_argument("--coordinator", default=DEFAULT_COORDINATOR, help="coordinator host name")
    p.add_argument("--subnet", default=DEFAULT_SUBNET, help="private test subnet the test bed owns")
    p.add_argument("--switch-name", default=SWITCH, help="name of the namespace holding the bridge")


def _topology(args: argparse.Namespace) -> tuple[Topology, str]:
    names = [args.coordinator, *(w.strip() for w in args.workers.split(",") if w.strip())]
    # A paced run pins: MLX hands each pass to a thread of its own, and waking it on another CPU cost about
    # 1 ms on this project's 2-core VM (a 1-row pass after a 5 ms hold: p50 1.6 ms, pinned 1.2).
    if args.cpus or getattr(args, "profile", None):
        sets, note = cpu_sets(len(names), sorted(os.sched_getaffinity(0)))
    else:
        sets, note = [""] * len(names), "not pinned (--cpus not given)"
    commands.rate_bits(args.rate)
    return Topology.build(names, args.subnet, args.rate, args.delay, sets, args.switch_name), note


def main(argv: list[str] | None = None) -> int:
    """Parse and run one test-bed command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, tail = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(
        prog="lan_testbed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _link_options(sub.add_parser("up", help="create the hosts, the bridge and the shaped links"))
    sub.add_parser("down", help="remove everything the test bed made, processes included")
    sub.add_parser("status", help="show hosts, addresses, shaping, delay mechanism, CPUs, processes")
    ex = sub.add_parser("exec", help="run a command on a host: lan_testbed exec HOST -- CMD")
    ex.add_argument("host")
    bench = sub.add_parser("bench", help="up, a worker a host, coordinator bench across the LAN, down")
    _link_options(bench)
    bench.add_argument(
        "--worker-model", default="default", help="model the workers serve (tiny: the fast pair)"
    )
    bench.add_argument(
        "--profile",
        help="emulate a hardware profile's machines ('paper', 'm2-ultra-27b', 'm2-ultra-70b' or a JSON "
        "file): every host paced as the "
        "machine of its name, the tiny pair at the paper's acceptance, then the planner against every row",
    )
    bench.add_argument(
        "--machines",
        default="",
        help="with --profile: the drafting hosts, each one of the profile's drafting machines (repeats "
        "allowed: m1-max,m1-max,m2-pro,m2-pro); default: each of them once",
    )
    bench.add_argument(
        "--family",
        choices=sorted(PAIRS),
        default="llama",
        help="with --profile: the emulated pair's architecture (hybrid: Qwen3.5's layout, as the paper's)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            topo, note = _topology(args)
            record = commands.up(topo, note)
            print(commands.status())
            return 0 if record else 1
        if args.command == "down":
            removed = commands.down()
            print(f"removed {', '.join(removed)}" if removed else "nothing to remove")
            return 0
        if args.command == "status":
            print(commands.status())
            return 0
        if args.command == "exec":
            if not tail:
                parser.error("exec needs a command after --")
            return commands.exec_in(args.host, tail)
        hosts: dict[str, str] = {}
        if args.profile:
            profile = load_profile(args.profile)
            chosen = [m.strip() for m in args.machines.split(",") if m.strip()]
            hosts = {name: machine.key for name, machine in profile.hosts(chosen)}
            args.coordinator, args.workers = profile.target_machine.key, ",".join(hosts)
        topo, note = _topology(args)
        if args.profile:
            preset = presets.paced_preset(args.profile, topo, args.family, hosts)
        else:
            preset = presets.Preset(worker_model=args.worker_model)
        return presets.bench_preset(topo, note, tail, preset)
    except (TestbedError, SpecwireError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyError as err:
        print(f"error: no host {err} in the test bed", file=sys.stderr)
        return 1
