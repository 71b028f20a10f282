"""``coordinator plan``: predict decode tok/s per machine and backend, and check the model.

``--profile paper`` projects the paper's machines (M2 Ultra target, M1 Max
and M2 Pro drafting) for every backend, with the model's error on the
paper's own Table 11 beside it. ``--from-bench FILE`` feeds the model the
inputs one ``coordinator bench`` run measured and compares its prediction
with every row of that run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from coordinator.planning import paper
from coordinator.planning.from_bench import check_bench
from coordinator.planning.model import Transport, ar_tok_s, best_k, predict
from specwire.errors import InvalidArgumentError

NAME = "plan"
HELP = "Predict decode tok/s per machine and backend (the paper's profile, or a bench run's inputs)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``coordinator plan``."""
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--profile", choices=["paper"], help="a built-in hardware profile: the paper's machines"
    )
    source.add_argument("--from-bench", type=Path, help="a bench JSON: predict every row from its own inputs")
    p.add_argument(
        "--hit-rate",
        type=float,
        default=0.5,
        help="pre-speculation hit rate assumed for stream+prespec (0..1)",
    )
    p.add_argument("--json", type=Path, help="write every input and prediction here")


def project_paper(hit_rate: float) -> dict[str, Any]:
    """Every backend on each of the paper's drafting machines, and the Table 11 check."""
    t, a = paper.target(), paper.acceptance()
    local = predict(
        t, 1 / paper.DRAFT_TOK_S["M2 Ultra (local)"], a, paper.K, paper.GIGABIT, Transport("local")
    )
    ar = ar_tok_s(t)
    backends = {
        "stream": paper.stream(),
        "stream+prespec": paper.stream(hit=hit_rate),
        "ggml-rpc/op": paper.per_op(),
        "ggml-rpc/token": paper.per_op(calls_per_pass=1, bytes_per_pass=paper.LOGITS_BYTES),
    }
    rows: list[dict[str, Any]] = [
        {"machine": "M2 Ultra", "backend": "local SD", "k": paper.K, "tok_s": local.tok_s}
    ]
    for machine in ("M1 Max", "M2 Pro"):
        draft_s = 1 / paper.DRAFT_TOK_S[machine]
        for name, transport in backends.items():
            p = predict(t, draft_s, a, paper.K, paper.GIGABIT, transport)
            best = best_k(t, draft_s, a, paper.GIGABIT, transport)
            rows.append(
                {
                    "machine": machine,
                    "backend": name,
                    "k": paper.K,
                    "tok_s": p.tok_s,
                    "best_k": best.k,
                    "best_tok_s": best.tok_s,
                    "parts_ms": {n: v * 1e3 for n, v in p.parts_s.items()},
                }
            )
    for row in rows:
        row["delta_vs_ar"] = row["tok_s"] / ar - 1
        row["delta_vs_local"] = row["tok_s"] / local.tok_s - 1
    checks = [
        {"figure": c.label, "paper": c.paper, "predicted": c.predicted, "error": c.error, "note": c.note}
        for c in paper.table11()
    ]
    return {
        "ar_tok_s": ar,
        "mean_accepted": a.mean_accepted,
        "hit_rate": hit_rate,
        "rows": rows,
        "table11": checks,
    }


def run(args: argparse.Namespace) -> int:
    """Run ``coordinator plan``."""
    if not 0 <= args.hit_rate <= 1:
        raise InvalidArgumentError(f"--hit-rate must be within 0..1, got {args.hit_rate}")
    if args.profile:
        out = project_paper(args.hit_rate)
        print(
            f"The paper's machines, k = {paper.K}, AR {out['ar_tok_s']:.1f} tok/s "
            f"(stream+prespec assumes {args.hit_rate:.0%} hits):"
        )
        print(f"{'machine':<10}{'backend':<16}{'tok/s':>8}{'Δ AR':>8}{'Δ local':>9}{'best k':>8}")
        for r in out["rows"]:
            best = f"{r['best_k']:>8}" if "best_k" in r else f"{'':>8}"
            print(
                f"{r['machine']:<10}{r['backend']:<16}{r['tok_s']:>8.1f}{r['delta_vs_ar']:>+8.0%}"
                f"{r['delta_vs_local']:>+9.0%}{best}"
            )
        print("\nTable 11 against the model:")
        for c in out["table11"]:
            print(
                f"  {c['figure']:<20} paper {c['paper']:>5.1f}  model {c['predicted']:>6.2f}  "
                f"{c['error']:>+5.0%}  ({c['note']})"
            )
    else:
        try:
            bench = json.loads(args.from_bench.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise InvalidArgumentError(f"cannot read the bench JSON {args.from_bench}: {err}") from err
        if bench.get("schema") != "specwire.bench/1":
            raise InvalidArgumentError(
                f"{args.from_bench} is not a coordinator bench JSON (schema specwire.bench/1)"
            )
        checks = check_bench(bench)
        out = {
            "rows": [
                {
                    "label": c.label,
                    "measured_tok_s": c.measured_tok_s,
                    "predicted_tok_s": c.predicted_tok_s,
                    "error": c.error,
                    "parts_ms": c.parts_ms,
                }
                for c in checks
            ]
        }
        print(f"{'row':<34}{'measured':>10}{'predicted':>11}{'error':>8}")
        for c in checks:
            print(f"{c.label:<34}{c.measured_tok_s:>10.2f}{c.predicted_tok_s:>11.2f}{c.error:>+8.1%}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0
