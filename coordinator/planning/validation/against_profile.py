"""A hardware profile's prediction for every row of a bench that emulated it, with no input from the run.

A bench run with ``--pace`` (the coordinator as the profile's target machine,
workers serving with ``--pace`` as its drafting machines) is checked here
against what the profile alone predicts: the machines' pass curves, the
pair's acceptance and agreement, the link and the protocol's costs, all from
the profile. From the run only what the set-up is, never what it measured:
which row drafts on which machine with which backend and k, and the draft
model's structure (operations per walked pass, vocabulary size), which set
the per-op baseline's calls and bytes.

Each row: AR; local SD with the target machine's draft curve; the stream
protocol; pre-speculation (``planning.ahead.prespec``: which branches the worker
drafts before the verdict; the tree, ``planning.profile.tree``); tree
verification (local tree SD and a worker's tree, ``planning.ahead.tree_verify``);
the per-op baseline at op granularity (a call
per operation, the profile's bytes a call, and the logits row of the
draft's vocabulary that the pass's last call ships: 196 KB a pass for the
test bed's ``tiny-draft``, which the profile's 471 bytes a call, an average
over the default model's 515 calls, leaves out at 31 calls) and token
granularity (a call per pass, carrying the logits row); several workers
racing (the fastest machine's prediction: each round goes to every worker
and the first reply wins). Rows the profile cannot
place (an unpaced worker) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.planning import profile as planned
from coordinator.planning.ahead.tree_verify import local_tree, remote_tree
from coordinator.planning.model import Acceptance, Link, Target, Transport, ar_tok_s, predict
from coordinator.planning.setups import FILL_FANOUT, FILL_ROWS, TREE_DEPTH, candidates, ranked
from specwire.drafting.ahead.prespec_config import TREE_ROWS
from specwire.emulation import paper
from specwire.emulation.profile import Profile
from specwire.errors import InvalidArgumentError

LOGIT_BYTES = 4  # float32
TREE_ROUNDS = 4000  # the tree's Monte Carlo (planning.ahead.ceiling), seeded: the same figure every time


@dataclass(frozen=True)
class ProfileCheck:
    """One bench row, measured, next to the profile's prediction (and the paper's figure, if any)."""

    label: str
    measured_tok_s: float
    predicted_tok_s: float
    paper_tok_s: float | None
    parts_ms: dict[str, float]

    @property
    def error(self) -> float:
        """Relative error of the prediction."""
        return self.predicted_tok_s / self.measured_tok_s - 1


def check_rows(profile: Profile, bench: dict[str, Any]) -> list[ProfileCheck]:
    """The profile's prediction beside every row of ``bench`` it can place (module docstring)."""
    k = int(bench["settings"]["k"])
    target = planned.target(profile)
    acceptance = planned.acceptance(profile) if k == profile.k else _acceptance_at(profile, k)
    link = planned.link(profile)
    workers = {w["name"]: w for w in bench["workers"]}
    prespec = bench["settings"].get("prespec", {})
    checks = []
    for row in bench["rows"]:
        if row.get("measured") is False:  # a worker failed it: no figure to check (bench.summary)
            continue
        predicted = _row(profile, row, workers, target, acceptance, link, k, prespec)
        if predicted is None:
            continue
        tok_s, parts = predicted
        checks.append(
            ProfileCheck(row["label"], row["decode_tok_s"], tok_s, _papers(profile, row, workers, k), parts)
        )
    return checks


def _acceptance_at(profile: Profile, k: int) -> Acceptance:
    per_draft = planned.acceptance(profile).profile
    return Acceptance(per_draft)


def _row(
    profile: Profile,
    row: dict[str, Any],
    workers: dict[str, dict[str, Any]],
    target: Target,
    acceptance: Acceptance,
    link: Link,
    k: int,
    prespec: dict[str, Any],
) -> tuple[float, dict[str, float]] | None:
    if row["kind"] == "ar":
        return ar_tok_s(target), {"verify": target.verify_s(1) * 1e3}
    if row["kind"] == "local-tree":
        if profile.local_draft is None:
            return None
        local = local_tree(profile, int(row.get("k") or TREE_DEPTH))
        return local.tok_s, {"local drafts": local.draft_s * 1e3}
    if row.get("k") and int(row["k"]) != k:  # a row at a k of its own (bench --local-k)
        k = int(row["k"])
        acceptance = planned.acceptance(profile) if k == profile.k else _acceptance_at(profile, k)
    if row["kind"] == "local":
        if profile.local_draft is None:
            return None
        return _predicted(
            target, 1 / profile.local_draft.decode_tok_s, acceptance, k, link, Transport("local")
        )
    names = list(workers) if row.get("multi") or row["kind"] == "auto" else [row["worker"]]
    options = []
    for name in names:
        option = (
            _remote(profile, row, workers[name], target, acceptance, link, k, prespec)
            if name in workers
            else None
        )
        if option is not None:
            options.append(option)
    return max(options, key=lambda o: o[0]) if options else None


def _remote(
    profile: Profile,
    row: dict[str, Any],
    worker: dict[str, Any],
    target: Target,
    acceptance: Acceptance,
    link: Link,
    k: int,
    prespec: dict[str, Any],
) -> tuple[float, dict[str, float]] | None:
    pace = worker.get("pace")
    if not pace or pace["profile"] != profile.name:
        return None
    machine = profile.machine(pace["machine"])
    if machine.draft is None:
        return None
    draft_s = 1 / machine.draft.decode_tok_s
    if row["backend"] == "ggml-rpc":
        ops, vocab = worker.get("ops_per_pass"), worker.get("vocab_size")
        if not ops or not vocab:
            return None
        if row["granularity"] == "op":  # a call per operation, and the logits row the last one ships
            nbytes = ops * profile.bytes_per_call + vocab * LOGIT_BYTES
            transport = planned.per_op(profile, calls_per_pass=ops, bytes_per_pass=nbytes)
        elif row["granularity"] == "token":
            transport = planned.per_op(profile, calls_per_pass=1, bytes_per_pass=vocab * LOGIT_BYTES)
        else:
            return None
        return _predicted(target, draft_s, acceptance, k, link, transport)
    if row.get("mode") == "tree-verify":
        if profile.local_draft is None:
            return None
        rows = int(row.get("rows") or prespec.get("tree_rows") or prespec.get("batch") or TREE_ROWS)
        t = remote_tree(profile, [machine], int(row.get("k") or TREE_DEPTH), rows, TREE_ROUNDS)
        return t.tok_s, {}
    if row["kind"] == "auto":  # the drafting policy: the best set-up the profile predicts on this worker
        best = ranked(profile, [s for s in candidates(profile, True) if s.worker in ("", machine.name)])[0]
        return best.tok_s, {}
    if row["prespec"]:
        k = int(prespec.get("k") or k)
        acceptance = planned.acceptance(profile) if k == profile.k else _acceptance_at(profile, k)
        if row.get("tree"):
            if profile.local_draft is None:
                return None
            rows = int(row.get("rows") or prespec.get("tree_rows") or prespec.get("batch") or TREE_ROWS)
            c = planned.tree(profile, machine, k, rows, TREE_ROUNDS)
            filled = sum((k - ready) * share for ready, share in c.ready.items())
            return c.tok_s, {"local drafts": filled / profile.local_draft.decode_tok_s * 1e3}
        if row.get("fill"):
            rows = int(prespec.get("fill_rows") or prespec.get("batch") or FILL_ROWS)
            rows_s = machine.draft.pass_s(1, rows)
            transport = planned.fill(profile, draft_s, k, rows, rows_s, FILL_FANOUT)
            return _predicted(target, draft_s, acceptance, k, link, transport)
        transport = planned.prespec(profile, draft_s, k)
    else:
        transport = planned.stream(profile)
    return _predicted(target, draft_s, acceptance, k, link, transport)


def _predicted(
    target: Target, draft_s: float, acceptance: Acceptance, k: int, link: Link, transport: Transport
) -> tuple[float, dict[str, float]]:
    p = predict(target, draft_s, acceptance, k, link, transport)
    return p.tok_s, {name: v * 1e3 for name, v in p.parts_s.items()}


def _papers(
    profile: Profile, row: dict[str, Any], workers: dict[str, dict[str, Any]], k: int
) -> float | None:
    """The paper's Table 11 figure for this row, when the profile is the paper's and it has one."""
    if profile.name != "paper":
        return None
    if row["kind"] == "local":  # the paper's local SD ran at its k
        return paper.TABLE11["local SD"] if int(row.get("k") or k) == profile.k else None
    if row["kind"] == "remote" and row["backend"] == "ggml-rpc" and not row.get("multi"):
        pace = (workers.get(row["worker"]) or {}).get("pace") or {}
        name = pace.get("machine_name")
        return paper.TABLE11.get(f"ggml-rpc → {name}")
    return None


def load_checked(profile: Profile, bench: dict[str, Any]) -> list[ProfileCheck]:
    """``check_rows``, or a clear error when the bench's coordinator did not emulate the profile's target
    machine (its rows would not be the profile's to predict)."""
    expected = f"{profile.name}:{profile.target_machine.key}"
    paced = bench["settings"].get("pace")
    if paced != expected:
        raise InvalidArgumentError(
            f"the bench's coordinator ran {'paced as ' + paced if paced else 'at its own speed'}, not as "
            f"{expected}: run the bench with --pace {expected} (scripts/lan_testbed bench --profile does)"
        )
    return check_rows(profile, bench)
