"""A profile's prediction for a bench row it can place, with no input from the run (``against_profile``)."""

from __future__ import annotations

import pytest

from coordinator.planning.validation.against_profile import LOGIT_BYTES, check_rows
from specwire.emulation.paper import load_profile

VOCAB, OPS = 49_152, 31  # the test bed's tiny-draft: the default model's vocabulary, a 31-operation walk


def per_op_bench(granularity: str) -> dict:
    """A bench of one per-op row on a worker paced as the paper's M1 Max (what the check reads of it)."""
    worker = {"name": "w", "pace": {"profile": "paper", "machine": "m1-max"}}
    row = {"label": "per-op", "kind": "remote", "backend": "ggml-rpc", "granularity": granularity}
    row |= {"worker": "w", "decode_tok_s": 20.0, "prespec": False}
    return {
        "settings": {"k": 2, "prespec": {}},
        "workers": [worker | {"ops_per_pass": OPS, "vocab_size": VOCAB}],
        "rows": [row],
    }


def test_a_per_op_pass_carries_its_logits_row_at_every_granularity() -> None:
    # The last call of a walked pass ships the draft's logits row, at op granularity as at token
    # granularity: 196 KB a pass for tiny-draft, which the profile's average bytes a call left out.
    paper = load_profile("paper")
    (op,) = check_rows(paper, per_op_bench("op"))
    (token,) = check_rows(paper, per_op_bench("token"))
    link_ms = {name: c.parts_ms["link"] for name, c in (("op", op), ("token", token))}
    row_ms = 2 * VOCAB * LOGIT_BYTES / paper.link_bandwidth_Bps * 1e3  # two drafts a round at k = 2
    assert link_ms["token"] == pytest.approx(2 * paper.link_rtt_s * 1e3 + row_ms)
    calls_ms = 2 * OPS * (paper.link_rtt_s * 1e3 + paper.bytes_per_call / paper.link_bandwidth_Bps * 1e3)
    assert link_ms["op"] == pytest.approx(calls_ms + row_ms)
