"""The bench presets: up, a worker a host, ``coordinator bench`` from the coordinator host, down.

The plain preset serves the default model at the machine's own speed; the
paced one (``--profile``) emulates the profile's machines and puts the
planner's prediction beside every row. Flags after ``--`` go to the bench
last, so they can change any of the preset's; a ``--json`` there is the file
the plan check and the pace check read.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from specwire.emulation.paper import PAIRS, load_profile
from specwire.emulation.profile import Profile
from testbed.commands import SCRIPTS, down, up
from testbed.system import TestbedError
from testbed.topology import Topology


@dataclass(frozen=True)
class Preset:
    """What the bench preset runs: the workers' model and flags per host, the bench's own flags."""

    worker_model: str = "default"
    worker_flags: dict[str, list[str]] = field(default_factory=dict)  # by host name
    coordinator_flags: list[str] = field(default_factory=list)
    bench_flags: list[str] = field(default_factory=list)
    json: str = "testbed-bench.json"
    plot: str = "testbed-bench.png"
    after: list[list[str]] = field(default_factory=list)  # commands run once the bench is done


def paced_preset(
    profile: str, topo: Topology, family: str = "llama", machines: dict[str, str] | None = None
) -> Preset:
    """The paper's set-up emulated: every host paced as the profile's machine of its name (a worker host
    as ``machines[host]``, when given: ``Profile.hosts`` names a machine's second host ``-2``).

    Workers serve ``tiny-draft`` (accepted as often as the paper's draft); the
    coordinator's ``tiny`` target and local ``tiny-draft`` run paced as the
    target machine. ``family`` hybrid runs ``tiny-hybrid`` and
    ``tiny-hybrid-draft`` instead, in Qwen3.5's layout (``PAIRS``). T = 0, the built-in
    prompts, 128 tokens, 2 repeats; AR, local SD at k = 2 (its best on these
    machines) and at the paper's k = 4, local tree SD, auto (the drafting
    policy with both workers), and per worker, at k = 2, the stream protocol,
    tree pre-speculation (a chain from the worker's tree), tree verification
    (the worker's tree verified in one pass) and the per-op baseline at op
    granularity. The planner then predicts every row from the profile alone
    (``coordinator plan --profile --check-bench``).
    """
    coordinator, *workers = topo.hosts
    target, draft = PAIRS[family]
    name = Path(profile).stem + ("" if family == "llama" else f"-{family}")
    json_path = f"testbed-{name}-bench.json"
    return Preset(
        worker_model=draft,
        worker_flags={
            h.name: _paced_worker(profile, h.name, (machines or {}).get(h.name, h.name)) for h in workers
        },
        coordinator_flags=[],
        bench_flags=[
            *("--pace", f"{profile}:{coordinator.name}", "--target", target, "--local-draft", draft),
            *("--backend", "auto,local-tree,stream,stream+prespec+fill+tree,stream+tree-verify,ggml-rpc"),
            *("--granularity", "op"),
            *("--k", "2", "--local-k", "4", "--max-tokens", "128", "--repeats", "2"),
            *("--rows", "16,32"),  # each worker's tree at 16 and 32 nodes a pass (32: as wide as auto takes)
            "--allow-overruns",  # a row whose pace was not held is marked and shown, then the preset fails
        ],
        json=json_path,
        plot=f"testbed-{name}-bench.png",
        after=[plan_check(profile, json_path)],
    )


def _paced_worker(profile: str, host: str, machine: str) -> list[str]:
    """A paced worker's flags: its machine, and for a machine's second host on, a label of its own
    ("M1 Max 2"; the first labels itself with the machine's name)."""
    flags = ["--pace", f"{profile}:{machine}"]
    if host != machine:
        flags += ["--label", Profile.host_label(host, load_profile(profile).machine(machine))]
    return flags


def _with_json(preset: Preset, bench_args: list[str]) -> Preset:
    """``preset`` reading the bench JSON that ``bench_args`` name (their ``--json``), if they name one."""
    if "--json" not in bench_args[:-1]:
        return preset
    path = bench_args[bench_args.index("--json") + 1]
    after = [[path if arg == preset.json else arg for arg in command] for command in preset.after]
    return replace(preset, json=path, after=after)


def plan_check(profile: str, bench_json: str) -> list[str]:
    """``coordinator plan``: the profile's prediction beside every row of the bench."""
    return [
        sys.executable,
        "-m",
        "coordinator.cli",
        "plan",
        "--profile",
        profile,
        "--check-bench",
        bench_json,
    ]


def bench_preset(topo: Topology, cpu_note: str, bench_args: list[str], preset: Preset) -> int:
    """Up, a worker on each worker host serving the preset's model, ``coordinator bench`` from the
    coordinator host, down.

    The bench runs ``--backend stream,ggml-rpc`` with the paper's settings,
    then the preset's flags; ``bench_args`` come last, so they can change any
    of them.
    """
    preset = _with_json(preset, bench_args)
    up(topo, cpu_note)
    lan_testbed = str(SCRIPTS / "lan_testbed")
    workers: list[subprocess.Popen[str]] = []
    try:
        for i, host in enumerate(topo.hosts[1:]):
            flags = preset.worker_flags.get(host.name, [])
            label = ("M1 Max", "M2 Pro")[i] if i < 2 else host.name
            if "--pace" in flags:  # a paced worker labels itself with its machine's name, or is given one
                label = ""
            serve = [
                sys.executable,
                "-m",
                "worker.cli",
                "serve",
                "--name",
                host.name,
                *(() if "--label" in flags else ("--label", label)),
                "--model",
                preset.worker_model,
                "--json",
                *flags,
            ]
            workers.append(
                subprocess.Popen(
                    [sys.executable, lan_testbed, "exec", host.name, "--", *serve],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for process in workers:
            _wait_ready(process)
        bench = [sys.executable, "-m", "coordinator.cli", "bench", "--backend", "auto,stream,ggml-rpc"]
        bench += ["--workers", ",".join(h.name for h in topo.hosts[1:]), "--k", "4", "--max-tokens", "200"]
        bench += ["--temperature", "0", "--plot", preset.plot, "--json", preset.json]
        bench += [*preset.bench_flags, *bench_args]
        code = subprocess.run(
            [sys.executable, lan_testbed, "exec", topo.hosts[0].name, "--", *bench], check=False
        ).returncode
        for command in preset.after if code == 0 else []:
            code = code or subprocess.run(command, check=False).returncode
        return code or _pace_not_held(preset.json)
    finally:
        for process in workers:
            process.send_signal(signal.SIGTERM)
        for process in workers:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
        down()


def _pace_not_held(bench_json: str) -> int:
    """1 (and why) when a paced row did not hold its pace, else 0."""
    try:
        rows = json.loads(Path(bench_json).read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return 0
    late = [r["label"] for r in rows if r.get("pace") and not r["pace"]["held"]]
    if late:
        print(f"lan_testbed: the pace was not held on {', '.join(late)} (see the Paced compute section)")
    return 1 if late else 0


def _wait_ready(process: subprocess.Popen[str], timeout_s: float = 300.0) -> dict:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise TestbedError(f"a worker exited before it was ready (code {process.wait()})")
        if line.startswith("{") and json.loads(line).get("event") == "ready":
            return json.loads(line)
    raise TestbedError("a worker was not ready in time")
