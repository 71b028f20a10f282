"""The per-op walk of any mlx-lm model: the model's own pass, stopped before each operation.

For each architecture the issue names (llama, Qwen2, Qwen3, Qwen3.5, Gemma 3,
Mistral, Phi-3), a small random-weight model of mlx-lm's own class is walked
op by op in this process: the logits equal the model's own pass over the same
tokens, bit for bit, across passes and after a rollback, and the walk's
operations follow the model's modules. A pass that cannot be split is refused
in one line that names where.
"""

from __future__ import annotations

import inspect
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import gemma3_text, llama, phi3, qwen2, qwen3, qwen3_5
from mlx_lm.models.cache import make_prompt_cache

from specwire.emulation import paper
from specwire.emulation.pace import ROUND_POSITIONS
from specwire.errors import UnsupportedModelError
from specwire.models import delta_scan, tiny_hybrid
from specwire.models.delta_scan import CHUNK, MIN_POSITIONS
from specwire.models.loading import load_model
from tests.support.models.tiny_models import as_loaded
from tests.support.walks import ops, walked
from worker.per_op import op_walk
from worker.per_op.op_walk import trace

VOCAB = 64
BASE = {
    "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": VOCAB, "max_position_embeddings": 512,
    "rope_theta": 10000.0,
}  # fmt: skip
HYBRID = {
    "model_type": "qwen3_5", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 4,
    "full_attention_interval": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
    "linear_num_value_heads": 2, "linear_num_key_heads": 1, "linear_key_head_dim": 8,
    "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
    "max_position_embeddings": 512, "tie_word_embeddings": False,
    "rope_parameters": {"type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.5},
}  # fmt: skip
# architecture -> (mlx-lm module, args, steps per block, what a block's walk must include)
ARCHITECTURES: dict[str, tuple[Any, dict[str, Any], int]] = {
    "llama": (llama, {**BASE, "model_type": "llama", "tie_word_embeddings": True}, 13),
    "mistral": (llama, {**BASE, "model_type": "mistral", "tie_word_embeddings": False}, 13),
    "qwen2": (qwen2, {**BASE, "model_type": "qwen2", "tie_word_embeddings": True}, 13),
    "qwen3": (qwen3, {**BASE, "model_type": "qwen3", "head_dim": 8, "tie_word_embeddings": True}, 15),
    "gemma3": (
        gemma3_text,
        {
            **BASE,
            "model_type": "gemma3_text",
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 4,
            "sliding_window_pattern": 2,
        },
        17,
    ),
    "phi3": (phi3, {**BASE, "model_type": "phi3"}, 10),
    "qwen3_5": (qwen3_5, HYBRID, 0),  # three Gated DeltaNet blocks of 13 steps, one gated attention of 15
}


def build(module: Any, args: dict[str, Any], seed: int = 0) -> nn.Module:
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(args))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_a_walked_pass_is_the_models_own_pass(architecture: str) -> None:
    module, args, per_block = ARCHITECTURES[architecture]
    model = build(module, args)
    session, graph = walked(as_loaded(model, args, architecture))
    blocks = args["num_hidden_layers"]
    assert len(graph.forward(0, [1])) == blocks + 2  # the layer granularity: before, each block, after
    if per_block:
        assert session.walk.ops_per_pass == per_block * blocks + 5
    else:
        assert session.walk.ops_per_pass == 13 * 3 + 15 + 5 and session.walk.recurrent
    cache = make_prompt_cache(model)

    def step(tokens: list[int]) -> None:
        walked_row = np.frombuffer(
            session.execute(ops(graph, session.position, tokens)).tensors[-1], np.float32
        )
        own = np.array(model(mx.array([tokens]), cache=cache)[0, -1].astype(mx.float32))
        assert np.array_equal(walked_row, own), f"{architecture}: {np.abs(walked_row - own).max()}"

    step([3, 5, 7, 9, 11])  # a prefill
    step([2])
    step([4, 6])
    session.execute([graph.trim(2)])  # back to the end of the second pass
    cache = make_prompt_cache(model)  # the model's own cache after the same two passes
    mx.eval(model(mx.array([[3, 5, 7, 9, 11]]), cache=cache), model(mx.array([[2]]), cache=cache))
    step([8])


def test_the_papers_draft_is_walked_in_the_recorded_number_of_operations() -> None:
    # Qwen3.5-0.8B's layout (24 blocks, full attention every fourth) at a small width: the count depends on
    # the blocks, not their size. paper.WALKED_OPS_PER_PASS is what `coordinator plan --profile paper` shows.
    model = build(qwen3_5, {**HYBRID, "num_hidden_layers": 24})
    assert trace(model).ops_per_pass == paper.WALKED_OPS_PER_PASS == 18 * 13 + 6 * 15 + 5


@pytest.mark.parametrize("spec", ["tiny-hybrid", "tiny-hybrid-draft"])
def test_a_walked_prefill_takes_the_delta_scan_as_the_models_own_pass_does(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The emulation's hybrid model runs a long run's delta rule as a scan on a CPU: the walk stops at it as
    # the one gated delta rule operation, so a prompt's prefill, and the decoding after it, stay bit-exact.
    loaded = load_model(spec)
    model = loaded.model
    scanned = []
    forward_scanned = tiny_hybrid.forward_scanned
    monkeypatch.setattr(tiny_hybrid, "forward_scanned", lambda *a: scanned.append(1) or forward_scanned(*a))
    session, graph = walked(loaded)
    cache = make_prompt_cache(model)
    spoken = model.language_model.lm_head.weight.shape[0]

    def step(tokens: list[int]) -> None:
        pass_ops = ops(graph, session.position, tokens)
        assert len(pass_ops) == session.walk.ops_per_pass
        walked_row = np.frombuffer(session.execute(pass_ops).tensors[-1], np.float32)[:spoken]
        own = np.array(model(mx.array([tokens]), cache=cache)[0, -1].astype(mx.float32))
        assert np.array_equal(walked_row, own), f"{spec}: {np.abs(walked_row - own).max()}"
        walked_state, own_state = (tree_flatten([layer.state for layer in c]) for c in (session.cache, cache))
        assert [name for name, _ in walked_state] == [name for name, _ in own_state]
        for (name, a), (_, b) in zip(walked_state, own_state, strict=True):  # the same cache, bit for bit
            assert mx.array_equal(a, b).item() if isinstance(a, mx.array) else a == b, name

    scanned.clear()  # the trace's own prefill took it too
    prompt = [(7 * i + 3) % spoken for i in range(CHUNK + 2 * MIN_POSITIONS)]  # over two of the scan's chunks
    step(prompt)
    for tokens in ([2], [4, 6, 8, 10], list(range(20, 20 + ROUND_POSITIONS)), [12]):
        step(tokens)  # a round's passes keep mlx-lm's loop
    # The walked prefill and the model's own took the scan (a GPU takes mlx-lm's kernel), no round's pass did.
    assert len(scanned) == (2 if mx.default_device() == mx.cpu else 0)
    session.execute([graph.trim(1)])  # back to the end of the round's longest pass, where the state was kept
    cache = make_prompt_cache(model)
    for tokens in (prompt, [2], [4, 6, 8, 10], list(range(20, 20 + ROUND_POSITIONS))):
        mx.eval(model(mx.array([tokens]), cache=cache))
    step([14])


def test_a_model_whose_prefill_stops_elsewhere_is_refused_naming_where(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The delta scan as the walk knew it before: a recurrent model's prefill that stops at no gated delta
    # rule is refused when the model is traced, not at a session's first prompt.
    monkeypatch.setattr(op_walk, "STAND_INS", ())
    monkeypatch.setattr(delta_scan, "scan_delta_rule", inspect.unwrap(delta_scan.scan_delta_rule))
    with pytest.raises(
        UnsupportedModelError,
        match=r"at language_model\.model\.layers\.0\.linear_attn:gated_delta_update: a pass of one position "
        r"and a prefill of 34 part there",
    ):
        trace(load_model("tiny-hybrid").model)


class CompiledMLP(llama.MLP):
    """An MLP whose modules run inside a compiled function (a pass the walk cannot stop inside)."""

    def __call__(self, x: mx.array) -> mx.array:
        if not hasattr(self, "_fused"):
            object.__setattr__(
                self,
                "_fused",
                mx.compile(lambda h: self.down_proj(nn.silu(self.gate_proj(h)) * self.up_proj(h))),
            )
        return self._fused(x)


def test_a_pass_that_cannot_be_split_is_refused_naming_where() -> None:
    module, args, _ = ARCHITECTURES["llama"]
    model = build(module, args)
    model.layers[1].mlp.__class__ = CompiledMLP
    with pytest.raises(
        UnsupportedModelError, match=r"cannot split this model's pass at model\.layers\.1\.mlp\."
    ):
        trace(model)
