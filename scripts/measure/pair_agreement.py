#!/usr/bin/env python3
"""How well a draft model agrees with its target: drafts accepted per round, and top-k agreement.

    python scripts/measure/pair_agreement.py                  # tiny and tiny-draft (the emulation's pair)
    python scripts/measure/pair_agreement.py --target default@float32 --draft default --max-tokens 32

On the built-in prompts (chat template), at T = 0: the mean number of drafts
accepted per round at ``--k`` (the bench's "Mean acc": every drafting round,
averaged per prompt, then over prompts), and, along the target's own greedy
output, how often the target's next token is the draft's first choice, within
its two and within its four most likely tokens. Pre-speculation guesses the
target's verdicts from the draft's top choices, so these decide how many of
its branches can hit. Published figures for real pairs are printed beside.

Its figures are in ``docs/measurements.md#the-emulations-pair``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from coordinator.planning.pair import agreement, mean_accepted
from specwire.emulation import paper
from specwire.models.loading import load_model

# Leviathan et al. 2023 (arXiv 2211.17192), Table 3: alpha at T = 0, the share of the target's
# tokens that are the draft's first choice (one-hot distributions), for real pairs.
LEVIATHAN_T0 = {
    "T5-XXL / T5-small (EnDe)": 0.75,
    "T5-XXL / T5-small (CNNDM)": 0.65,
    "LaMDA 137B / 100M": 0.61,
    "LaMDA 137B / 2B": 0.71,
}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="tiny")
    p.add_argument("--draft", default="tiny-draft")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    target, draft = load_model(args.target), load_model(args.draft)
    out = {
        "target": target.spec,
        "draft": draft.spec,
        "k": args.k,
        "mean_accepted": mean_accepted(target, draft, args.k, args.max_tokens),
        "agreement": agreement(target, draft, args.max_tokens),
        "paper_mean_accepted": paper.mean_accepted(),
        "specinfer_greedy": paper.AGREEMENT,
        "leviathan_t0": LEVIATHAN_T0,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    settings = f"k = {args.k}, T = 0, built-in prompts, {args.max_tokens} tokens"
    print(f"{draft.spec} drafting for {target.spec}, {settings}")
    accepted, papers = out["mean_accepted"], paper.mean_accepted()
    print(f"  drafts accepted per round: {accepted:.2f} (the paper's Table 7: {papers:.2f})")
    a, s = out["agreement"], paper.AGREEMENT
    print("  agreement with the target's next token:  top-1   top-2   top-4")
    print(f"    this pair                              {a['top1']:.1%}   {a['top2']:.1%}   {a['top4']:.1%}")
    print(f"    SpecInfer, LLaMA-7B / LLaMA-68M        {s['top1']:.1%}   {s['top2']:.1%}   {s['top4']:.1%}")
    print("  (SpecInfer, ASPLOS 2024, Table 1, greedy, mean of its five datasets)")
    print(
        "  top-1 of real pairs at T = 0 (Leviathan et al. 2023, Table 3): "
        + ", ".join(f"{name} {v:.2f}" for name, v in LEVIATHAN_T0.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
