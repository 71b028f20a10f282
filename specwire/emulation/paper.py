"""The paper's machines as the built-in profile ``paper``, every figure with its source.

The paper is seeds/000 (Efficient On-Device LLM Inference on Apple Silicon,
March 2026): a Qwen3.5-9B Q8_0 target on an M2 Ultra, a Qwen3.5-0.8B Q8_0
draft on the M2 Ultra itself, an M1 Max or an M2 Pro, over Gigabit Ethernet.

* decode tok/s: the 9B on the M2 Ultra 42.4 (Tables 5 to 7); the 0.8B 140.2
  on the M2 Ultra (Table 5), 86.6 and 62.9 on the M1 Max and M2 Pro (Table 11's
  note);
* prompt tok/s, where a pass becomes compute-bound: the 9B 1163.9 and the
  0.8B 7410.7 on the M2 Ultra (Table 5). The 0.8B's on the M1 Max and M2 Pro
  are not given; they are scaled from the M2 Ultra's by the machines' ratio
  for the 9B (Table 6: 483.7 and 321.3 against 1163.9);
* verification: k + 1 positions cost about one (section 4.5.1): no extra
  time per position, so the curve is flat until prompt speed binds;
* acceptance: the paper's "Avg Accept%" (3.3% at k = 4) cannot be the share
  of drafts accepted (local SD would then make 21.7 tok/s, not 53.3), so the
  mean drafts accepted per round is taken from Table 7's local SD: 53.3 tok/s
  times the round of its target and draft speeds, minus the token the
  target adds (1.78 at k = 4);
* agreement of the draft's top choices with the target's token: not in the
  paper; SpecInfer's (Miao et al., ASPLOS 2024, Table 1: LLaMA-7B verifying
  LLaMA-68M's top-k at T = 0, mean over its five datasets) stands in;
* the link: Gigabit Ethernet as the LAN test bed emulates it, 0.15 ms each
  way (the paper says a round trip is "<= 1 ms") and 125 MB/s;
* the per-op baseline: 1,737 ggml graph nodes per token for Qwen3.5-0.8B, as
  llama.cpp (build 8240) logs them (24 layers, 18 of them Gated DeltaNet),
  and the full logits row of its 248,320-token vocabulary per pass.
"""

from __future__ import annotations

from pathlib import Path

from specwire.emulation import big_targets
from specwire.emulation.profile import Machine, PassCurve, Profile

K = 4
TARGET_MACHINE = "M2 Ultra"
TARGET_TOK_S = 42.4
TARGET_PREFILL_TOK_S = 1163.9
DRAFT_TOK_S = {"M2 Ultra": 140.2, "M1 Max": 86.6, "M2 Pro": 62.9}
_PREFILL_9B = {"M2 Ultra": 1163.9, "M1 Max": 483.7, "M2 Pro": 321.3}
DRAFT_PREFILL_TOK_S = {m: 7410.7 * _PREFILL_9B[m] / _PREFILL_9B["M2 Ultra"] for m in _PREFILL_9B}
TABLE7_LOCAL_SD = 53.3
TABLE11 = {"local SD": 53.8, "ggml-rpc → M1 Max": 11.2, "ggml-rpc → M2 Pro": 9.4}
TABLE11_REMOTE_DRAFT_TOK_S = {"M1 Max": 16.0, "M2 Pro": 14.2}
LINK_RTT_S = 0.3e-3
LINK_BANDWIDTH_BPS = 125e6
OPS_PER_PASS = 1737
# The draft's blocks (Qwen3.5-0.8B: 24, full attention every fourth), and the operations of one pass
# as specwire's per-op walk splits it (worker.per_op.op_walk on that layout:
# tests/worker/per_op/test_op_walk.py).
DRAFT_BLOCKS = {"gated_attention": 6, "gated_delta": 18}
WALKED_OPS_PER_PASS = 329
LOGITS_BYTES = 248_320 * 4
# SpecInfer, Table 1, greedy: top-1, top-2 and top-4 over Alpaca, CP, WebQA, CIP and PIQA.
SPECINFER_GREEDY = {"top1": (68, 69, 62, 70, 63), "top2": (77, 79, 72, 81, 75), "top4": (84, 86, 80, 88, 83)}
AGREEMENT = {name: sum(v) / len(v) / 100 for name, v in SPECINFER_GREEDY.items()}


def mean_accepted() -> float:
    """Drafts accepted per round at k = 4, from Table 7's local SD (see the module docstring)."""
    round_s = 1 / TARGET_TOK_S + K / DRAFT_TOK_S[TARGET_MACHINE]
    return TABLE7_LOCAL_SD * round_s - 1


def profile() -> Profile:
    """The M2 Ultra verifying (and drafting for itself), the M1 Max and M2 Pro drafting for it."""

    def draft(machine: str) -> PassCurve:
        return PassCurve(DRAFT_TOK_S[machine], DRAFT_PREFILL_TOK_S[machine])

    return Profile(
        name="paper",
        target_machine=Machine(
            TARGET_MACHINE, draft(TARGET_MACHINE), PassCurve(TARGET_TOK_S, TARGET_PREFILL_TOK_S)
        ),
        workers=(Machine("M1 Max", draft("M1 Max")), Machine("M2 Pro", draft("M2 Pro"))),
        mean_accepted=mean_accepted(),
        k=K,
        link_rtt_s=LINK_RTT_S,
        link_bandwidth_Bps=LINK_BANDWIDTH_BPS,
        ops_per_pass=OPS_PER_PASS,
        logits_bytes=LOGITS_BYTES,
        agreement=AGREEMENT,
    )


BUILT_IN = ("paper", *big_targets.TARGETS)
# The models the emulation runs for the paper's pair, by family: (target, draft), each draft calibrated to
# the paper's acceptance. ``hybrid`` is Qwen3.5's own layers (a Gated DeltaNet layer, then full attention).
PAIRS = {"llama": ("tiny", "tiny-draft"), "hybrid": ("tiny-hybrid", "tiny-hybrid-draft")}


def load_profile(name: str) -> Profile:
    """The built-in profile ``name`` (``paper``, ``m2-ultra-27b``, ``m2-ultra-70b``), or a profile file at
    that path."""
    if name == "paper":
        return profile()
    if name in big_targets.TARGETS:
        return big_targets.profile(name, profile())
    return Profile.load(Path(name).expanduser())
