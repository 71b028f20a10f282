"""The M2 Ultra with the dense targets its owners run, built in as ``m2-ultra-27b`` and ``m2-ultra-70b``.

The paper (seeds/000) measured one target, Qwen3.5-9B Q8_0. People buy an M2
Ultra with 192 GB for larger ones: Qwen3.5-27B at Q8_0 (26.7 GB) and
Llama-3.3-70B at Q4_K_M (39.9 GB), the file sizes of seeds/004's table of
RAM by parameters and quantization. Each profile is the paper's, with the
target's curve scaled by the paper's own law:

* decode is bound by reading the weights (Table 6): the 9B decodes at 42.4
  tok/s from a 12.07 GB payload, so the M2 Ultra reads about 512 GB/s
  effectively, and a target of S GB decodes at 512 / S tok/s: 19.2 for the
  27B, 12.8 for the 70B;
* the prompt rate, where a pass is bound by compute, scales as one over the
  parameters: the 9B's 1163.9 tok/s (Table 5) times 9 / 27 and 9 / 70;
* everything else is the paper's: its draft (Qwen3.5-0.8B Q8_0) on the M2
  Ultra, the M1 Max and the M2 Pro, the link, the per-op baseline's ops, and
  the acceptance and agreement of its pair. No source gives the 0.8B's
  acceptance against these targets (and the 70B is a Llama, another
  vocabulary): the paper's pair stands in, so these profiles say what the
  *machines* allow, at the paper's acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specwire.emulation.profile import Machine, PassCurve, Profile

PAPER_TARGET_PARAMS_B = 9.0
PAPER_TARGET_PAYLOAD_GB = 12.07  # Table 6: the 9B Q8_0's weight payload


@dataclass(frozen=True)
class BigTarget:
    """A dense target on the M2 Ultra: its model, weights in GB (seeds/004) and parameters in billions."""

    model: str
    size_gb: float
    params_b: float


TARGETS = {
    "m2-ultra-27b": BigTarget("Qwen3.5-27B Q8_0", 26.7, 27.0),
    "m2-ultra-70b": BigTarget("Llama-3.3-70B Q4_K_M", 39.9, 70.0),
}


def profile(name: str, paper: Profile) -> Profile:
    """The paper's profile with its target replaced by ``TARGETS[name]``, its curve scaled from the 9B's
    (module docstring): decode by the weights read, the prompt rate by the parameters."""
    big, nine_b = TARGETS[name], paper.target
    bandwidth_gbps = nine_b.decode_tok_s * PAPER_TARGET_PAYLOAD_GB  # about 512 GB/s
    assert nine_b.prefill_tok_s is not None
    curve = PassCurve(
        bandwidth_gbps / big.size_gb, nine_b.prefill_tok_s * PAPER_TARGET_PARAMS_B / big.params_b
    )
    machine = paper.target_machine
    return replace(paper, name=name, target_machine=Machine(machine.name, machine.draft, curve))
