"""The performance model over a hardware profile's machines: every backend on each drafting machine.

``coordinator plan --profile`` prints this projection: AR, local SD and local
tree SD on the target machine, and per worker the stream protocol, the
per-op baseline, tree pre-speculation and tree verification (the trees by
the Monte Carlos of ``planning.profile`` and ``planning.ahead.tree_verify``), with
the ceiling and, for the paper's profile, its Table 11 beside them.

With several workers the projection adds one more row, the workers growing
one tree together. No drafting source runs that set-up (the model puts it
within a few percent of the fastest worker alone: docs/tree-verification.md),
so the row is marked ``built: False`` and is never the set-up to use.
"""

from __future__ import annotations

from typing import Any

from coordinator.planning import profile as planned
from coordinator.planning.ahead.tree_verify import curve_tree_rows, local_tree, remote_tree
from coordinator.planning.model import Prediction, Transport, ar_tok_s, predict
from coordinator.planning.setups import TREE_DEPTH
from coordinator.planning.validation import paper
from specwire.drafting.ahead.prespec_config import TREE_ROWS
from specwire.emulation.profile import Machine, Profile

TREE_K_MAX = 4  # the tree rows' best k is sought up to here (a Monte Carlo per k)


def _tok_s(prediction: Prediction) -> float:
    return prediction.tok_s


def project_profile(profile: Profile, ceiling_rounds: int = 0) -> dict[str, Any]:
    """Every backend on each of the profile's drafting machines (for the paper's, the Table 11 check)."""
    t, a, k, link = planned.target(profile), planned.acceptance(profile), profile.k, planned.link(profile)
    ar = ar_tok_s(t)
    rows: list[dict[str, Any]] = []
    local = None
    if profile.local_draft is not None:
        local_s = 1 / profile.local_draft.decode_tok_s
        local = predict(t, local_s, a, k, link, Transport("local")).tok_s
        best_local = max(
            (predict(t, local_s, a, kk, link, Transport("local")) for kk in range(1, 17)), key=_tok_s
        )
        rows.append(
            {
                "machine": "target machine",
                "backend": "local SD",
                "k": k,
                "tok_s": local,
                "best_k": best_local.k,
            }
            | {"best_tok_s": best_local.tok_s, "parts_ms": {}}
        )
        tree = local_tree(profile, TREE_DEPTH)
        rows.append(
            {"machine": "target machine", "backend": "local tree SD", "k": TREE_DEPTH, "tok_s": tree.tok_s}
            | {"best_k": TREE_DEPTH, "best_tok_s": tree.tok_s, "parts_ms": {}, "nodes": tree.nodes}
        )
    # Each backend's transport (the same at every k).
    fixed: dict[str, Transport] = {"stream": planned.stream(profile)}
    if profile.ops_per_pass:
        fixed["ggml-rpc/op"] = planned.per_op(profile)
    if profile.logits_bytes:
        fixed["ggml-rpc/token"] = planned.per_op(
            profile, calls_per_pass=1, bytes_per_pass=profile.logits_bytes
        )
    for machine in profile.workers:
        assert machine.draft is not None
        draft_s = 1 / machine.draft.decode_tok_s
        for name, transport in fixed.items():
            p = predict(t, draft_s, a, k, link, transport)
            best = max((predict(t, draft_s, a, kk, link, transport) for kk in range(1, 17)), key=_tok_s)
            parts = {n: v * 1e3 for n, v in p.parts_s.items()}
            rows.append(
                {"machine": machine.name, "backend": name, "k": k, "tok_s": p.tok_s, "best_k": best.k}
                | {"best_tok_s": best.tok_s, "parts_ms": parts}
            )
        if profile.local_draft is not None and ceiling_rounds:  # the trees: Monte Carlos, like the ceiling
            rows.append(_tree_row(profile, machine, k, ceiling_rounds))
            rows.append(_tree_verify_row(profile, [machine], ceiling_rounds))
    drafting = [m for m in profile.workers if m.draft is not None]
    if profile.local_draft is not None and ceiling_rounds and len(drafting) > 1:
        rows.append(_tree_verify_row(profile, drafting, ceiling_rounds) | {"built": False})
    for row in rows:
        row["delta_vs_ar"] = row["tok_s"] / ar - 1
        row["delta_vs_local"] = None if local is None else row["tok_s"] / local - 1
    best_row = max((r for r in rows if r.get("built", True)), key=lambda r: r.get("best_tok_s", r["tok_s"]))
    out: dict[str, Any] = {
        "profile": profile.name,
        "use": {
            k: best_row[k] for k in ("machine", "backend", "best_k", "best_tok_s", "rows") if k in best_row
        },
        "ar_tok_s": ar,
        "mean_accepted": a.expected_accepted(k),
        "rows": rows,
        "ceiling": planned.ceilings(profile, TREE_ROWS, rounds=ceiling_rounds) if ceiling_rounds else [],
    }
    if profile.name == "paper":
        out["table11"] = [
            {"figure": c.label, "paper": c.paper, "predicted": c.predicted, "error": c.error, "note": c.note}
            for c in paper.table11()
        ]
        out["per_op_walk"] = paper.walked_ops()
    return out


def _tree_row(profile: Profile, machine: Machine, k: int, rounds: int) -> dict[str, Any]:
    """Tree pre-speculation (``planning.profile.tree``) at the profile's k and at its best k."""
    ks = range(1, TREE_K_MAX + 1)
    by_k = {kk: planned.tree(profile, machine, kk, TREE_ROWS, rounds).tok_s for kk in ks}
    best_k = max(by_k, key=lambda kk: by_k[kk])
    at_k = by_k[k] if k in by_k else planned.tree(profile, machine, k, TREE_ROWS, rounds).tok_s
    return {"machine": machine.name, "backend": "stream+prespec+fill+tree", "k": k, "tok_s": at_k} | {
        "best_k": best_k,
        "best_tok_s": by_k[best_k],
        "parts_ms": {},
        "rows": TREE_ROWS,
    }


def _tree_verify_row(profile: Profile, machines: list[Machine], rounds: int) -> dict[str, Any]:
    """``machines`` growing one tree, verified in one pass a round (``planning.ahead.tree_verify``), each
    pass as wide as costs no more (``curve_tree_rows``: what auto's set-up opens)."""
    rows = min(curve_tree_rows(m.draft) for m in machines if m.draft is not None)
    t = remote_tree(profile, machines, TREE_DEPTH, rows, rounds)
    name = " + ".join(m.name for m in machines)
    return {"machine": name, "backend": "stream+tree-verify", "k": TREE_DEPTH, "tok_s": t.tok_s} | {
        "best_k": TREE_DEPTH,
        "best_tok_s": t.tok_s,
        "parts_ms": {},
        "rows": rows,
        "nodes": t.nodes,
        "local_trees": t.local_share,
    }
