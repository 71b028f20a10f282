"""``coordinator plan``: predict decode tok/s per machine and backend, and check the model.

Without a profile it measures this set-up as ``--draft auto`` does (the
target's verification curve, the local draft's pass, the pair's agreement
on a calibration text, each worker's advertised pass curve and its link,
``coordinator.planning.measured``), then predicts every set-up auto chooses
from (AR, local SD, and per worker the stream protocol and a tree, each
at its best k) and says which auto would take.

``--profile paper`` projects the paper's machines (M2 Ultra target, M1 Max
and M2 Pro drafting) for every backend, with the model's error on the
paper's own Table 11 beside it. ``--from-bench FILE`` feeds the model the
inputs one ``coordinator bench`` run measured and compares its prediction
with every row of that run.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio

from coordinator.bench.plot import write_check_plot
from coordinator.commands.options import (
    add_credential_arguments,
    add_discover_timeout_argument,
    add_interface_argument,
    add_local_draft_argument,
    add_target_argument,
    pace_of,
    worker_access,
)
from coordinator.drafting.factory import DraftSources
from coordinator.drafting.spec import DraftSpec
from coordinator.planning.concurrent import ROWS, batched
from coordinator.planning.fit import FITS, emulation_fit
from coordinator.planning.measured import MeasuredSetup
from coordinator.planning.planner import Planner, simplest_near_best
from coordinator.planning.projection import project_profile
from coordinator.planning.setups import best_per_mode
from coordinator.planning.validation.against_profile import load_checked
from coordinator.planning.validation.from_bench import check_bench, unmodelled
from coordinator.runtime import coordinator_runtime
from specwire.emulation.paper import PAIRS, load_profile
from specwire.emulation.profile import PassCurve, Profile
from specwire.errors import InvalidArgumentError
from specwire.models.loading import load_model

CALIBRATION_BACKENDS = ("stream", "ggml-rpc")
CALIBRATION_GRANULARITIES = ("op", "token")
CALIBRATION_PROMPT = "def fibonacci(n):"  # short: prefill is not what is measured
NAME = "plan"
HELP = "Predict decode tok/s per machine and backend (the paper's profile, or a bench run's inputs)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``coordinator plan``."""
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--profile",
        help="a hardware profile: 'paper' (the paper's machines), 'm2-ultra-27b' or 'm2-ultra-70b' "
        "(the M2 Ultra with a 27B or 70B target), built in, or a JSON file "
        "(coordinator/planning/profile.py says what it holds)",
    )
    source.add_argument("--from-bench", type=Path, help="a bench JSON: predict every row from its own inputs")
    p.add_argument(
        "--check-bench",
        type=Path,
        metavar="BENCH_JSON",
        help="with --profile: the profile's prediction beside every row of a bench that emulated it "
        "(--pace), with no input from that run",
    )
    p.add_argument(
        "--ceiling-rounds",
        type=int,
        default=2000,
        help="with --profile: rounds of the ceiling's Monte Carlo (planning/ahead/ceiling.py); 0 skips it",
    )
    p.add_argument(
        "--family",
        choices=sorted(PAIRS),
        default="llama",
        help="with --profile: the emulation pair whose passes are timed against the profile's pace "
        "(hybrid: Qwen3.5's layout)",
    )
    p.add_argument(
        "--no-fit",
        action="store_true",
        help="with --profile: skip timing this machine's passes against the profile's (planning/fit.py)",
    )
    p.add_argument("--json", type=Path, help="write every input and prediction here")
    p.add_argument(
        "--plot",
        type=Path,
        help="with --check-bench: a PNG of every row measured, beside the paper's figure and the prediction",
    )
    live = p.add_argument_group("measuring this set-up (no --profile or --from-bench), as --draft auto does")
    add_target_argument(live)
    add_local_draft_argument(live)
    live.add_argument(
        "--workers",
        "--worker",
        metavar="NAMES",
        default="all",
        help="worker names or HOST:PORT (comma-separated), all, or none",
    )
    live.add_argument("--temperature", type=float, default=0.0, help="the sampling temperature to plan for")
    live.add_argument(
        "--acceptance",
        type=float,
        help="per-draft acceptance to plan with (0..1; default: the pair's, measured on a calibration text)",
    )
    add_discover_timeout_argument(live)
    live.add_argument(
        "--pace",
        metavar="PROFILE:MACHINE",
        help="calibrate with this coordinator paced as a profile's target machine (see bench --pace)",
    )
    add_interface_argument(p)
    add_credential_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Run ``coordinator plan``."""
    if args.acceptance is not None and not 0 <= args.acceptance <= 1:
        raise InvalidArgumentError(f"--acceptance must be within 0..1, got {args.acceptance}")
    if args.acceptance is not None and (args.profile or args.from_bench):
        raise InvalidArgumentError(
            "--acceptance plans a measured set-up; a profile has mean_accepted, a bench its own"
        )
    if args.ceiling_rounds < 0:
        raise InvalidArgumentError(f"--ceiling-rounds must be 0 or more, got {args.ceiling_rounds}")
    if args.check_bench is not None and not args.profile:
        raise InvalidArgumentError("--check-bench checks a profile: give --profile too")
    if args.check_bench is not None:
        bench = read_bench(args.check_bench)
        out: dict[str, Any] = {"rows": profile_rows(load_profile(args.profile), bench)}
        if args.plot:
            s = bench["settings"]
            title = (
                f"The paper's Macs, emulated (paced {s.get('pace')}; T = {s['temperature']}, "
                f"{s['max_tokens']} tokens, {s['prompts']} prompts x {s['repeats']})"
            )
            write_check_plot(out["rows"], title, args.plot)
    elif args.profile:
        profile = load_profile(args.profile)
        out = project_profile(profile, args.ceiling_rounds)
        print(f"Profile {profile.name}, k = {profile.k}, AR {out['ar_tok_s']:.1f} tok/s:")
        print(f"{'machine':<16}{'backend':<26}{'tok/s':>8}{'Δ AR':>8}{'Δ local':>9}{'best k':>8}{'tok/s':>8}")
        for r in out["rows"]:
            best = f"{r['best_k']:>8}{r['best_tok_s']:>8.1f}" if "best_k" in r else ""
            delta_local = "" if r["delta_vs_local"] is None else f"{r['delta_vs_local']:+.0%}"
            unbuilt = "" if r.get("built", True) else "  (a model only: no set-up drafts on several workers)"
            print(
                f"{r['machine']:<16}{r['backend']:<26}{r['tok_s']:>8.1f}{r['delta_vs_ar']:>+8.0%}"
                f"{delta_local:>9}{best}{unbuilt}"
            )
        use = out["use"]
        rows = f", {use['rows']} rows a pass (--rows {use['rows']})" if "rows" in use else ""
        print(
            f"Use: {use['backend']} on the {use['machine']} at k = {use['best_k']}{rows} "
            f"({use['best_tok_s']:.1f} tok/s, {use['best_tok_s'] / out['ar_tok_s']:.2f}x AR)"
        )
        _print_ceiling(out)
        if profile.local_draft is not None:
            out["concurrent"] = _print_concurrent(profile, out)
        if out.get("table11"):
            print("\nTable 11 against the model:")
        for c in out.get("table11", []):
            print(
                f"  {c['figure']:<20} paper {c['paper']:>5.1f}  model {c['predicted']:>6.2f}  "
                f"{c['error']:>+5.0%}  ({c['note']})"
            )
        if not args.no_fit:
            out["fit"] = _print_fit(profile, args.family)
        if "per_op_walk" in out:
            w = out["per_op_walk"]
            blocks = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in w["blocks"].items())
            print(
                f"\nCalls per draft pass, per op, for the paper's draft (Qwen3.5-0.8B: {blocks}): "
                f"llama.cpp's graph {w['ggml_nodes_per_pass']:,} nodes (used above); "
                f"specwire's walker {w['walked_ops_per_pass']} operations"
            )
    elif args.from_bench is None:
        out = plan_here(args)
    else:
        bench = read_bench(args.from_bench)
        if "runs" not in bench:
            raise InvalidArgumentError(
                f"{args.from_bench} holds no per-run records ('runs'; a run recorded in docs/runs "
                "leaves them out), and --from-bench fits its inputs to them: pass the JSON the bench "
                "wrote (--json), or check the run against a profile with --profile NAME --check-bench"
            )
        out = {"rows": checked_rows(bench)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def _print_concurrent(profile: Profile, out: dict[str, Any]) -> list[dict[str, Any]]:
    """Requests decoded together by ``serve`` (coordinator.planning.concurrent), against one alone at the
    best single-request set-up here."""
    alone = max(r["best_tok_s"] for r in out["rows"] if r["machine"] == "target machine")
    print(f"\nConcurrent requests, decoded together ({profile.target_machine.name} drafting for all):")
    rows = []
    for n in ROWS:
        b = batched(profile, n)
        rows.append(
            {"requests": n, "k": b.k, "round_ms": b.round_s * 1e3, "tok_s": b.tok_s} | {"alone": alone}
        )
        print(
            f"  {n} at once: k = {b.k}, a round {b.round_s * 1e3:.1f} ms, {b.tok_s:.1f} tok/s together "
            f"({b.per_request_tok_s:.1f} each), {b.tok_s / alone:.2f}x one request alone ({alone:.1f})"
        )
    return rows


def _print_fit(profile: Profile, family: str) -> list[dict[str, Any]]:
    """This machine's real time for each pass the profile's paced set-ups run, over its paced time, and a
    warning for every pass that would not fit (``planning.fit``)."""
    fits = emulation_fit(profile, family)
    print(
        f"\nThis machine against the profile's passes (the {family} emulation pair, unpaced, idle; "
        f"a pass fits at most {FITS:.0%} of its paced time, leaving room for the other hosts):"
    )
    print(f"  {'machine':<12}{'model':<8}{'pass':<26}{'real ms':>9}{'paced ms':>10}{'share':>7}")
    for f in fits:
        flag = "" if f.fits else "  does not fit"
        print(
            f"  {f.machine:<12}{f.model:<8}{f.shape:<26}{f.real_s * 1e3:>9.2f}{f.paced_s * 1e3:>10.2f}"
            f"{f.share:>7.2f}{flag}"
        )
    for f in fits:
        if not f.fits:
            print(
                f"warning: the {f.machine}'s {f.model} pass over {f.shape} takes {f.share:.0%} of its paced "
                f"time here: a paced row running it may not hold its pace on this machine"
            )
    return [asdict(f) | {"share": f.share, "fits": f.fits} for f in fits]


def _print_ceiling(out: dict[str, Any]) -> None:
    """The most drafting off the critical path can give, against local SD at its best k."""
    if not out["ceiling"]:
        return
    local = next((r["best_tok_s"] for r in out["rows"] if r["backend"] == "local SD"), None)
    print(
        "\nCeiling: workers drafting a tree of continuations ahead, best first, as deep as their passes "
        "allow; one chain verified a round; k chosen each round (planning/ahead/ceiling.py):"
    )
    for c in out["ceiling"]:
        rows = "/".join(str(r) for r in c["rows"])
        versus = "" if local is None else f"  {c['tok_s'] / local:.2f}x local SD at its best k"
        print(f"  {c['workers']:<36} {rows:>6} rows a pass {c['tok_s']:>7.1f} tok/s{versus}")


def read_bench(path: Path) -> dict[str, Any]:
    """A bench JSON, or a clear error."""
    try:
        bench = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise InvalidArgumentError(f"cannot read the bench JSON {path}: {err}") from err
    if not isinstance(bench, dict) or bench.get("schema") != "specwire.bench/1":
        raise InvalidArgumentError(f"{path} is not a coordinator bench JSON (schema specwire.bench/1)")
    return bench


def profile_rows(profile: Profile, bench: dict[str, Any]) -> list[dict[str, Any]]:
    """The profile's prediction beside every row of a bench that emulated it; printed as a table."""
    checks = load_checked(profile, bench)
    print(
        f"Profile {profile.name} against the bench ({bench['settings'].get('pace') or 'unpaced'} "
        "coordinator): measured, the paper's Table 11, and the profile's prediction (no input from the run)"
    )
    width = max(len(c.label) for c in checks) + 2
    print(f"{'row':<{width}}{'measured':>10}{'paper':>8}{'planned':>10}{'error':>8}")
    for c in checks:
        figure = f"{c.paper_tok_s:>8.1f}" if c.paper_tok_s is not None else f"{'–':>8}"
        print(
            f"{c.label:<{width}}{c.measured_tok_s:>10.2f}{figure}{c.predicted_tok_s:>10.2f}{c.error:>+8.1%}"
        )
    return [
        {
            "label": c.label,
            "measured_tok_s": c.measured_tok_s,
            "paper_tok_s": c.paper_tok_s,
            "predicted_tok_s": c.predicted_tok_s,
            "error": c.error,
            "parts_ms": c.parts_ms,
        }
        for c in checks
    ]


def checked_rows(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """The model against every row of a bench run; printed as a table."""
    checks = check_bench(bench)
    width = max([34, *(len(c.label) + 2 for c in checks)])
    print(f"{'row':<{width}}{'measured':>10}{'predicted':>11}{'error':>8}")
    for c in checks:
        print(f"{c.label:<{width}}{c.measured_tok_s:>10.2f}{c.predicted_tok_s:>11.2f}{c.error:>+8.1%}")
    left_out = [row["label"] for row in bench["rows"] if unmodelled(row)]
    if left_out:
        print(f"not modelled from a bench's own inputs (auto, trees): {', '.join(left_out)}")
    return [
        {
            "label": c.label,
            "measured_tok_s": c.measured_tok_s,
            "predicted_tok_s": c.predicted_tok_s,
            "error": c.error,
            "parts_ms": c.parts_ms,
        }
        for c in checks
    ]


def plan_here(args: argparse.Namespace) -> dict[str, Any]:
    """Measure this machine and its workers as ``--draft auto`` does, then predict every set-up it chooses
    from (its best k each) and say which it would take."""
    started = time.perf_counter()
    print(f"measuring this machine and the workers ({args.workers}) ...", flush=True)
    planner = anyio.run(_measure, args)
    alpha = args.acceptance if args.acceptance is not None else planner.prior(args.temperature)
    ranking = planner.ranking(args.temperature, alpha)
    print(f"measured in {time.perf_counter() - started:.0f} s:")
    for line in measured_lines(planner, args.temperature):
        print(f"  {line}")
    best = best_per_mode(ranking)
    ar = next(p.tok_s for p in ranking if p.setup.mode == "ar")
    local = next((p.tok_s for p in best if p.setup.mode == "local"), None)
    print(f"\nPredicted decode tok/s at T = {args.temperature:g}, acceptance {alpha:.2f} (best k of each):")
    print(f"{'set-up':<40}{'k':>4}{'tok/s':>9}{'Δ AR':>8}{'Δ local':>9}")
    rows = []
    for p in best:
        title = p.setup.label.rsplit(" k=", 1)[0]
        delta_local = "" if local is None else f"{p.tok_s / local - 1:+.0%}"
        print(f"{title:<40}{p.setup.k:>4}{p.tok_s:>9.1f}{p.tok_s / ar - 1:>+8.0%}{delta_local:>9}")
        rows.append({"setup": title, "mode": p.setup.mode, "worker": p.setup.worker, "k": p.setup.k})
        rows[-1] |= {"tok_s": p.tok_s, "delta_vs_ar": p.tok_s / ar - 1}
    chosen = simplest_near_best(ranking)
    pays = "a worker pays" if chosen.setup.remote else "no worker pays here"
    print(f"\nauto would choose {chosen.setup.label} ({chosen.tok_s:.1f} tok/s): {pays}")
    return {
        "temperature": args.temperature,
        "acceptance": alpha,
        "measured": measured_record(planner.measured),
        "rows": rows,
        "auto": {"setup": chosen.setup.label, "tok_s": chosen.tok_s},
    }


async def _measure(args: argparse.Namespace) -> Planner:
    """This machine (paced, with --pace) and the workers, measured as auto measures them."""
    pace = pace_of(args)
    access = worker_access(args)
    names = [w.strip() for w in args.workers.split(",") if w.strip()]
    selectors = () if names == ["all"] else tuple(names)
    async with coordinator_runtime() as runtime:
        target = await runtime.compute.run(load_model, args.target)
        if pace is not None:
            target = pace.target_model(target)
        async with DraftSources(runtime, target, access, pace) as sources:
            local = "" if args.local_draft == "none" else args.local_draft
            planner, _ = await sources.auto(DraftSpec("auto", local=local, workers=selectors))
            return planner


def measured_lines(planner: Planner, temperature: float) -> list[str]:
    """What was measured, a line each: the target's curve, the local draft, the pair, each worker."""
    m = planner.measured
    lines = [
        f"target: {1e3 / m.target.decode_tok_s:.2f} ms a pass, +{m.target.per_position_s * 1e3:.2f} ms a "
        "position verified"
    ]
    if m.local_draft is not None:
        lines.append(f"local draft: {1e3 / m.local_draft.decode_tok_s:.2f} ms a pass")
    if m.agreement is not None:
        a = m.agreement
        lines.append(
            f"the pair: top-1/2/4 agreement {a.top1:.2f}/{a.top2:.2f}/{a.top4:.2f}; acceptance at "
            f"T = {temperature:g}: {planner.prior(temperature):.2f}"
        )
    for w in m.workers:
        lines.append(
            f"worker {w.title} ({w.address}, {w.model}): {1e3 / w.curve.decode_tok_s:.2f} ms a pass, "
            f"+{w.curve.per_position_s * 1e3:.2f} ms a row; link {w.link_rtt_s * 1e3:.2f} ms round trip"
            + ("" if w.tree else "; no trees (recurrent layers)")
            + ("; on this machine, sharing its processors: drafting on demand only" if w.colocated else "")
        )
    return lines


def measured_record(m: MeasuredSetup) -> dict[str, Any]:
    """The measured inputs as plain data."""
    return {
        "target": _curve(m.target),
        "local_draft": _curve(m.local_draft),
        "agreement": m.agreement.greedy() if m.agreement is not None else None,
        "workers": [
            {"name": w.name, "title": w.title, "address": w.address, "model": w.model, "tree": w.tree}
            | {"colocated": w.colocated}
            | {"curve": _curve(w.curve), "link_rtt_ms": w.link_rtt_s * 1e3}
            for w in m.workers
        ],
    }


def _curve(c: PassCurve | None) -> dict[str, float] | None:
    return None if c is None else {"pass_ms": 1e3 / c.decode_tok_s, "per_position_ms": c.per_position_s * 1e3}
