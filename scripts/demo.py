#!/usr/bin/env python3
"""The main job out of the box: the paper's Macs emulated, then this machine's real model.

1. **The paper's Macs, emulated** (paced compute, real protocol and network):
   a ``worker serve`` process paced as each of the paper's M1 Max and M2 Pro
   (``--machines``: any of its drafting machines, repeats allowed), each
   behind the delay relay on 127.0.0.1 (0.15 ms each way: the LAN test bed's
   namespaces need root, which the demo does not assume), and the bench paced
   as the M2 Ultra, with the tiny pair (``tiny`` target, ``tiny-draft``
   accepted as often as the paper's draft); then the planner's prediction from
   the paper's profile alone beside every row.
2. **This machine's real model**: two workers serving the default model, and
   ``coordinator bench --backend auto,stream,ggml-rpc`` at MLX-CPU speed.

Bonjour stays on 127.0.0.1; workers and relays are stopped on the way out,
whether the bench succeeded, failed or was interrupted. Arguments the demo
does not take go to the bench (the real-model one; with ``--paced``, the
paced one). ``python scripts/demo.py --help`` gives the options, the time it
takes and examples (``DESCRIPTION``, ``EPILOG``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from testbed.topology import cpu_sets

from specwire.emulation.paper import PAIRS, load_profile
from specwire.emulation.profile import Profile
from specwire.errors import SpecwireError
from specwire.process.command_line import DEVICE_ENV

SCRIPTS = Path(__file__).resolve().parent
RELAY = SCRIPTS / "delay_relay.py"
WORKERS = (("m1-max", "M1 Max"), ("m2-pro", "M2 Pro"))
DELAY_MS = 0.15
# Short enough to finish in minutes on a CPU; the paper used 200 tokens.
REAL_BENCH = ["--max-tokens", "16", "--k", "4", "--plot", "demo-bench.png", "--json", "demo-bench.json"]
PACED_BENCH = ["--pace", "paper:m2-ultra", "--max-tokens", "64"]
PACED_BENCH += ["--backend", "auto,local-tree,stream,stream+prespec+fill+tree,stream+tree-verify,ggml-rpc"]
PACED_BENCH += ["--granularity", "op,token"]
PACED_BENCH += ["--k", "2", "--local-k", "4"]
# A row whose pace a busy 2-core machine could not hold is marked NOT HELD and named below, not fatal.
PACED_BENCH += ["--allow-overruns"]
FAST_BENCH = ["--target", "tiny", "--local-draft", "tiny", "--granularity", "op,layer,token,round"]
FAST_BENCH += ["--max-tokens", "64", "--k", "4", "--json", "demo-fast-bench.json"]
READY_TIMEOUT_S = 300.0
ENV = {**os.environ, "SPECWIRE_MDNS_INTERFACES": "127.0.0.1"}
PACED_SAYS = (
    "The paper's Macs, emulated: paced compute, real protocol and network. Every forward pass of the tiny "
    "pair runs for real and is held to the time the paper's M2 Ultra, M1 Max or M2 Pro takes for it; the "
    f"network is loopback through the delay relay at {DELAY_MS} ms each way (the LAN test bed, "
    "scripts/lan_testbed bench --profile paper, needs root). It shows what each backend gives where the Macs "
    "live: a slower Mac drafting loses to the M2 Ultra drafting for itself unless drafting leaves the "
    "critical path, and GGML_RPC-style per-op calls lose most."
)
REAL_SAYS_CPU = (
    "This machine's real model: SmolLM2-135M on MLX's CPU backend, unpaced. On a CPU a pass over k + 1 "
    "positions costs about k + 1 single passes, so speculative decoding loses to AR here, and the stream "
    "protocol's cost is buried under compute while the per-op baseline's is not."
)
REAL_SAYS_GPU = (
    "This machine's real model: SmolLM2-135M on MLX's GPU backend, unpaced, the two workers sharing the "
    "GPU with the coordinator (so drafting on a worker competes with verifying, as it would not across Macs)."
)


def real_says() -> str:
    """What the real part shows, for the backend MLX runs on here."""
    import mlx.core as mx

    return REAL_SAYS_GPU if mx.default_device() == mx.gpu else REAL_SAYS_CPU


def start_worker(name: str, label: str, model: str, *extra: str, cpus: str = "") -> subprocess.Popen[str]:
    """Start one worker on 127.0.0.1 with mDNS on loopback (on ``cpus`` only, if given)."""
    command = [sys.executable, "-m", "worker.cli", "serve", "--host", "127.0.0.1"]
    command += ["--interface", "127.0.0.1", "--name", name, "--label", label, "--json", "--model", model]
    if "--port" not in extra:
        command += ["--port", "0"]
    return subprocess.Popen(
        [*command, *extra], stdout=subprocess.PIPE, text=True, env=ENV, preexec_fn=pinned(cpus)
    )


def pinned(cpus: str) -> Callable[[], None] | None:
    """A child's start hook that keeps it on ``cpus`` ("0", "1,2,3"), where the platform can (Linux)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    chosen = {int(c) for c in cpus.split(",")}
    return lambda: os.sched_setaffinity(0, chosen)


def paced_cpus(workers: int) -> list[str]:
    """The paced part's CPU sets, the coordinator's first (``testbed.topology.cpu_sets``: one each where
    there are enough, else the coordinator one and the workers the rest); none where pinning is not
    possible. MLX hands each pass to a thread of its own, and a wake on another CPU costs
    (docs/emulation.md)."""
    if not hasattr(os, "sched_getaffinity"):
        return [""] * (1 + workers)
    return cpu_sets(1 + workers, sorted(os.sched_getaffinity(0)))[0]


def wait_ready(process: subprocess.Popen[str], name: str) -> dict:
    """Read a process's JSON ready line (or fail if it exits first)."""
    assert process.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise SystemExit(f"demo: {name} exited before it was ready (code {process.wait()})")
        if line.startswith("{") and json.loads(line).get("event") == "ready":
            return dict(json.loads(line))
    raise SystemExit(f"demo: {name} was not ready within {READY_TIMEOUT_S:.0f} s")


def stop(processes: list[subprocess.Popen[str]]) -> None:
    """SIGTERM every process (workers send their Bonjour goodbye), then make sure they are gone."""
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in processes:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def loopback_latency_ms() -> float:
    """One-way latency of a relayed loopback path before any added delay (taken off the relay's delay)."""
    relay = subprocess.Popen(
        [sys.executable, str(RELAY), "--echo", "127.0.0.1:47103", "--map", "127.0.0.1:47102=127.0.0.1:47103"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(relay, "the calibration relay")
        out = subprocess.run(
            [sys.executable, str(RELAY), "--measure", "127.0.0.1:47102"],
            capture_output=True,
            text=True,
            check=True,
        )
        return float(json.loads(out.stdout)["rtt_p50_ms"][0]) / 2
    finally:
        stop([relay])


def paced_workers(
    processes: list[subprocess.Popen[str]], model: str, machines: list[str], cpus: list[str]
) -> list[str]:
    """Start a paced worker serving ``model`` for each of the paper's ``machines`` (``Profile.hosts``),
    each behind a relay on the worker's ``cpus``; returns the relays' addresses."""
    delay = max(0.0, DELAY_MS - loopback_latency_ms())
    hosts = load_profile("paper").hosts(machines)
    addresses = []
    workers = []
    for i, (name, machine) in enumerate(hosts):
        port, echo = 47110 + 4 * i, 47111 + 4 * i
        public, public_echo = port + 2, echo + 2
        relay = [sys.executable, str(RELAY), "--delay-ms", f"{delay:.4f}"]
        relay += [
            "--map",
            f"127.0.0.1:{public}=127.0.0.1:{port}",
            "--map",
            f"127.0.0.1:{public_echo}=127.0.0.1:{echo}",
        ]
        processes.append(
            subprocess.Popen(relay, stdout=subprocess.PIPE, text=True, preexec_fn=pinned(cpus[i]))
        )
        wait_ready(processes[-1], f"the relay of {name}")
        flags = ["--pace", f"paper:{machine.key}", "--port", str(port), "--echo-port", str(echo)]
        flags += ["--advertise-host", "127.0.0.1", "--advertise-port", str(public)]
        flags += ["--advertise-echo-port", str(public_echo)]
        label = Profile.host_label(name, machine)
        workers.append((name, start_worker(f"paced-{name}", label, model, *flags, cpus=cpus[i])))
        processes.append(workers[-1][1])
        addresses.append(f"127.0.0.1:{public}")
    for name, process in workers:
        wait_ready(process, f"worker paced-{name}")
    return addresses


def bench(workers: list[str], flags: list[str], cpus: str = "") -> int:
    """``coordinator bench`` against ``workers`` with ``flags`` (on ``cpus`` only, if given)."""
    command = [sys.executable, "-m", "coordinator.cli", "bench", "--backend", "auto,stream,ggml-rpc"]
    command += ["--workers", ",".join(workers), "--interface", "127.0.0.1", *flags]
    print("demo: " + " ".join(Path(a).name if i == 0 else a for i, a in enumerate(command)), flush=True)
    return subprocess.run(command, env=ENV, check=False, preexec_fn=pinned(cpus)).returncode


def section(title: str, says: str) -> None:
    print(f"\n{'=' * 100}\n{title}\n{says}\n{'=' * 100}", flush=True)


def paced_part(
    argv: list[str] | None = None, family: str = "llama", machines: list[str] | None = None
) -> int:
    """The paper's Macs, emulated, and the planner's prediction from the profile alone; ``argv`` go to
    the bench after the preset's arguments, so they can change any of them. ``family`` names the pair
    (``specwire.emulation.paper.PAIRS``: hybrid is Qwen3.5's layout); ``machines`` the paced workers (the
    paper's drafting machines, repeats allowed; none: each once)."""
    section("1. The paper's Macs, emulated: paced compute, real protocol and network", PACED_SAYS)
    target, draft = PAIRS[family]
    suffix = "" if family == "llama" else f"-{family}"
    report = f"demo-paced{suffix}-bench.json"
    flags = [*PACED_BENCH, "--target", target, "--local-draft", draft, "--json", report]
    argv = argv or []
    if "--json" in argv[:-1]:  # the bench takes the last --json: the one given here
        report = argv[argv.index("--json") + 1]
    processes: list[subprocess.Popen[str]] = []
    cpus = paced_cpus(len(load_profile("paper").hosts(machines or [])))
    try:
        code = bench(paced_workers(processes, draft, machines or [], cpus[1:]), [*flags, *argv], cpus[0])
    finally:
        stop(processes)
    if code == 0:
        say_not_held(report)
        plan = [sys.executable, "-m", "coordinator.cli", "plan", "--profile", "paper"]
        # The rows beside the paper's Table 11 and the planner's prediction.
        check = [*plan, "--check-bench", report, "--plot", f"demo-paced{suffix}.png"]
        code = subprocess.run(check, check=False).returncode
    return code


def say_not_held(report: str) -> None:
    """Name the rows whose paced compute overran (the bench marks them NOT HELD in its tables)."""
    try:
        rows = json.loads(Path(report).read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return
    missed = [r["label"] for r in rows if (r.get("pace") or {}).get("held") is False]
    if missed:
        print(
            f"demo: the pace was not held on {', '.join(missed)}: this machine was too busy to emulate the "
            "Macs exactly there (more than 1% of a side's passes overran); rerun on an idle machine",
            file=sys.stderr,
        )


def real_part(argv: list[str], fast: bool) -> int:
    """Two unpaced local workers and the bench with the default model (or the tiny one with --fast)."""
    if not fast:
        section("2. This machine's real model, unpaced", real_says())
    processes = [
        start_worker(name, f"{label} (stand-in)", "tiny" if fast else "default") for name, label in WORKERS
    ]
    try:
        for (name, _), process in zip(WORKERS, processes, strict=True):
            ready = wait_ready(process, f"worker {name}")
            print(
                f"demo: worker {ready['name']} ready on 127.0.0.1:{ready['port']} (pid {ready['pid']})",
                flush=True,
            )
        return bench([name for name, _ in WORKERS], [*(FAST_BENCH if fast else REAL_BENCH), *argv])
    finally:
        stop(processes)


DESCRIPTION = """\
The README's `make demo`: speculative decoding across Macs, shown on this machine in two parts.

1. The paper's Macs, emulated. Two `worker serve` processes paced as the paper's M1 Max and M2 Pro,
   each behind a delay relay on 127.0.0.1 (0.15 ms each way), and `coordinator bench` paced as the
   M2 Ultra, with the tiny model pair. It prints what --draft auto chose against the target alone and
   local speculative decoding, the table of every backend (stream protocol, trees, the per-op
   baseline), and the planner's prediction beside every row.
   Writes demo-paced-bench.json and demo-paced.png.
2. This machine's real model: two unpaced workers serving the default model (SmolLM2-135M) and
   `coordinator bench --backend auto,stream,ggml-rpc` at this machine's speed.
   Writes demo-bench.json and demo-bench.png.

It takes about 6 minutes on a 2-core machine. It needs no root and no network
beyond 127.0.0.1, and stops its workers and relays on the way out, on success, failure or Ctrl-C."""

EPILOG = """\
Any other argument goes to a bench: the real-model one, or with --paced the paced one
(`coordinator bench --help` lists them).

examples:
  python scripts/demo.py                          # both parts (make demo)
  python scripts/demo.py --max-tokens 200         # the paper's length, for the real-model bench
  python scripts/demo.py --fast                   # the tiny model unpaced: where protocol cost shows
  python scripts/demo.py --paced --k 2            # the paced part alone, --k 2 to its bench
  python scripts/demo.py --paced --family hybrid  # ... with the pair in Qwen3.5's layout
  python scripts/demo.py --paced --machines m1-max,m1-max,m2-pro,m2-pro   # four paced workers"""


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description and examples as written, and each option's default where it has one to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if "default" in (action.help or "") or action.default in (None, False, ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The demo's own options; ``parse_known_args`` leaves the rest for the bench. Prefixes are not
    taken as options (``allow_abbrev=False``), so a bench flag such as ``--pace`` is not read as
    ``--paced``."""
    parser = argparse.ArgumentParser(
        prog="demo.py",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    part = parser.add_mutually_exclusive_group()
    part.add_argument("--paced", action="store_true", help="run only part 1, the paper's Macs emulated")
    part.add_argument(
        "--fast", action="store_true", help="run only the tiny model, unpaced: where protocol cost shows"
    )
    advanced = parser.add_argument_group("advanced")
    advanced.add_argument(
        "--family",
        choices=sorted(PAIRS),
        default="llama",
        help="the emulated pair of part 1 (hybrid: Qwen3.5's layout)",
    )
    advanced.add_argument(
        "--machines",
        default="",
        help="the paced workers of part 1: the paper's drafting machines, repeats allowed (default: each "
        "drafting machine of the paper's profile once, m1-max,m2-pro)",
    )
    advanced.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        help="where every process's MLX computes ($SPECWIRE_DEVICE; default: MLX's own). On a GPU host "
        "part 1 runs well on CPUs: its passes are held to the profile anyway",
    )
    return parser


def main(argv: list[str]) -> int:
    """The paced part, then the real-model part (or with --fast, the tiny model alone; with --paced, the
    paced part alone)."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.device:
        ENV[DEVICE_ENV] = args.device
    machines = [m.strip() for m in args.machines.split(",") if m.strip()]
    try:
        load_profile("paper").hosts(machines)  # an unknown machine is refused before anything starts
    except SpecwireError as err:
        parser.error(str(err))
    try:
        if args.paced:
            return paced_part(rest, args.family, machines)
        if args.fast:
            return real_part(rest, fast=True)
        paced = paced_part(family=args.family, machines=machines)
        return real_part(rest, fast=False) or paced
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
