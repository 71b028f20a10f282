"""The paper's machines as a hardware profile, and the model's reproduction of its Table 11.

Figures from seeds/000 (Efficient On-Device LLM Inference on Apple
Silicon, March 2026): Table 5 and 6 (tok/s on the M2 Ultra), Table 7 (local
SD, 0.8B Q8_0 draft, 9B Q8_0 target, k = 4: 53.3 tok/s), Table 11
(GGML_RPC: local 53.8, M1 Max 11.2, M2 Pro 9.4 tok/s; effective remote
draft 16.0 and 14.2 tok/s against 86.6 and 62.9 locally), section 4.5.1
(verification of k + 1 positions takes about the time of one on Metal).

Inputs that are not the paper's, each with its source:

* the link: Gigabit Ethernet as the LAN test bed emulates it, 0.15 ms each
  way (0.3 ms round trip; the paper says "<= 1 ms") and 125 MB/s;
* the per-call protocol cost of the op granularity, 0.55 ms, and 471 bytes
  per call: this project's per-op baseline measured on loopback (README,
  "The per-op baseline");
* operations per forward pass of Qwen3.5-0.8B: 1,737 ggml graph nodes per
  token, as llama.cpp (build 8240) logs them for that model (24 layers, 18
  of them Gated DeltaNet linear attention); the per-op baseline makes one
  call per operation;
* the stream backend's protocol cost per round, 2.07 ms: this project's
  measurement on loopback (README, "One stream round, part by part").

Acceptance: the paper's "Avg Accept%" (3.3% at k = 4) cannot be the
fraction of drafts accepted: with it, local SD would make 1.13 tokens per
52 ms round, 21.7 tok/s, not the 53.3 measured. The mean number of drafts
accepted per round is therefore taken from Table 7's own local SD figure
(tokens per round = 53.3 tok/s x the round time of its target and draft
speeds); Table 11's local SD (53.8) is then a prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.planning.model import Acceptance, Link, Target, Transport, predict
from coordinator.planning.profile import PER_CALL_S, Profile

K = 4
TARGET_TOK_S = 42.4  # 9B Q8_0 on the M2 Ultra (Tables 5, 6)
DRAFT_TOK_S = {"M2 Ultra (local)": 140.2, "M1 Max": 86.6, "M2 Pro": 62.9}  # 0.8B Q8_0 (Tables 5, 11)
TABLE7_LOCAL_SD = 53.3
TABLE11 = {"local SD": 53.8, "ggml-rpc → M1 Max": 11.2, "ggml-rpc → M2 Pro": 9.4}
TABLE11_REMOTE_DRAFT_TOK_S = {"M1 Max": 16.0, "M2 Pro": 14.2}
GIGABIT = Link(rtt_s=0.3e-3, bandwidth_Bps=125e6)
OPS_PER_PASS = 1737  # Qwen3.5-0.8B ggml graph nodes per token (llama.cpp log)
# One forward pass per call (the shape of llama.cpp's RPC, GRAPH_COMPUTE) moves the logits back:
# Qwen3.5's vocabulary of 248,320 float32 values.
LOGITS_BYTES = 248_320 * 4


def target() -> Target:
    """The M2 Ultra verifying for the 9B target: flat in k on Metal (section 4.5.1)."""
    return Target(verify_1_s=1 / TARGET_TOK_S, per_position_s=0.0)


def acceptance() -> Acceptance:
    """Mean drafts accepted per round at k = 4, from Table 7's local SD."""
    round_s = target().verify_s(K + 1) + K / DRAFT_TOK_S["M2 Ultra (local)"]
    return Acceptance.constant_for(TABLE7_LOCAL_SD * round_s - 1, K)


def profile() -> Profile:
    """The paper's machines as a profile: M2 Ultra target, M1 Max and M2 Pro drafting, Gigabit."""
    return Profile(
        name="paper",
        target_tok_s=TARGET_TOK_S,
        workers={m: DRAFT_TOK_S[m] for m in ("M1 Max", "M2 Pro")},
        mean_accepted=acceptance().expected_accepted(K),
        k=K,
        local_draft_tok_s=DRAFT_TOK_S["M2 Ultra (local)"],
        link=GIGABIT,
        ops_per_pass=OPS_PER_PASS,
        logits_bytes=LOGITS_BYTES,
    )


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
    t, a, per_op = target(), acceptance(), profile().per_op()
    local = predict(t, 1 / DRAFT_TOK_S["M2 Ultra (local)"], a, K, GIGABIT, Transport("local"))
    checks = [Check("local SD", TABLE11["local SD"], local.tok_s, "acceptance from Table 7")]
    for machine in ("M1 Max", "M2 Pro"):
        draft_s = 1 / DRAFT_TOK_S[machine]
        op = predict(t, draft_s, a, K, GIGABIT, per_op)
        checks.append(
            Check(
                f"ggml-rpc → {machine}",
                TABLE11[f"ggml-rpc → {machine}"],
                op.tok_s,
                f"{OPS_PER_PASS} calls per draft token at {PER_CALL_S * 1e3:.2f} ms + RTT",
            )
        )
    return checks


def overhead_per_draft_token_s(machine: str) -> float:
    """The paper's GGML_RPC overhead per draft token: remote minus local draft time (Table 11)."""
    return 1 / TABLE11_REMOTE_DRAFT_TOK_S[machine] - 1 / DRAFT_TOK_S[machine]


def implied_calls_per_pass(machine: str) -> float:
    """Round trips per draft token at this project's per-call cost that the paper's overhead implies."""
    return overhead_per_draft_token_s(machine) / (PER_CALL_S + GIGABIT.rtt_s)
