"""The model's reproduction of the paper's Table 11, from the built-in profile (``specwire.emulation.paper``).

The profile's figures and their sources are in ``specwire.emulation.paper``. Here the
model predicts Table 11's local SD (a check of the acceptance taken from
Table 7) and its GGML_RPC rows from a round trip per ggml node at this
project's measured cost per call, and says how many round trips per draft
token the paper's measured overhead implies instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.planning import profile as planned
from coordinator.planning.model import Transport, predict
from specwire.emulation import paper
from specwire.emulation.profile import PER_CALL_S, Profile

K = paper.K
TABLE11 = paper.TABLE11
TABLE11_REMOTE_DRAFT_TOK_S = paper.TABLE11_REMOTE_DRAFT_TOK_S
DRAFT_TOK_S = paper.DRAFT_TOK_S


def profile() -> Profile:
    """The paper's set-up (``specwire.emulation.paper``)."""
    return paper.profile()


@dataclass(frozen=True)
class Check:
    """One of the paper's figures next to the model's prediction."""

    label: str
    paper: float
    predicted: float
    note: str

    @property
    def error(self) -> float:
        """Relative error of the prediction."""
        return self.predicted / self.paper - 1


def table11() -> list[Check]:
    """The model's Table 11, from the paper's profile and this project's per-call cost."""
    p = profile()
    t, a, link = planned.target(p), planned.acceptance(p), planned.link(p)
    local = predict(t, 1 / DRAFT_TOK_S[paper.TARGET_MACHINE], a, K, link, Transport("local"))
    checks = [Check("local SD", TABLE11["local SD"], local.tok_s, "acceptance from Table 7")]
    for machine in ("M1 Max", "M2 Pro"):
        op = predict(t, 1 / DRAFT_TOK_S[machine], a, K, link, planned.per_op(p))
        checks.append(
            Check(
                f"ggml-rpc → {machine}",
                TABLE11[f"ggml-rpc → {machine}"],
                op.tok_s,
                f"{paper.OPS_PER_PASS} calls per draft token at {PER_CALL_S * 1e3:.2f} ms + RTT",
            )
        )
    return checks


def walked_ops() -> dict[str, Any]:
    """The paper's draft as specwire's walker would run it per op, beside llama.cpp's graph nodes."""
    return {
        "ggml_nodes_per_pass": paper.OPS_PER_PASS,
        "walked_ops_per_pass": paper.WALKED_OPS_PER_PASS,
        "blocks": dict(paper.DRAFT_BLOCKS),
    }


def overhead_per_draft_token_s(machine: str) -> float:
    """The paper's GGML_RPC overhead per draft token: remote minus local draft time (Table 11)."""
    return 1 / TABLE11_REMOTE_DRAFT_TOK_S[machine] - 1 / DRAFT_TOK_S[machine]


def implied_calls_per_pass(machine: str) -> float:
    """Round trips per draft token at this project's per-call cost that the paper's overhead implies."""
    return overhead_per_draft_token_s(machine) / (PER_CALL_S + paper.LINK_RTT_S)
