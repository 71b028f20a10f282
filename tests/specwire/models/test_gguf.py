"""The GGUF loader: real default model quality, and tiny files in every supported layout."""

from __future__ import annotations

import math
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from specwire.errors import ModelFormatError, UnsupportedModelError
from specwire.models.loading import LoadedModel, load_model
from tests.support.models.gguf_models import converter_permute, write_llama_gguf
from tests.support.models.tiny_models import tiny_llama

PASSAGE = (Path(__file__).parents[2] / "data" / "passage.txt").read_text()
# SmolLM2-135M scores about 20 on this plain passage (measured); a loader that
# scrambles weights or tokens lands in the thousands.
PERPLEXITY_BOUND = 60.0
PERPLEXITY_TOKENS = 64  # 41.2 on the default model (21.8 at 128 tokens, 18.6 over the whole passage)
# Dequantizing changes only the precision of the arithmetic, not the weights:
# the quantized model carries float16 activations (its scales are float16),
# the dequantized one float32. On logits of magnitude ~15 that moves the
# largest entry by under 0.1 (measured 0.073) and the mean by far less.
DEQUANTIZED_LOGIT_MAX_ATOL = 0.15
DEQUANTIZED_LOGIT_MEAN_ATOL = 0.02


def perplexity(model: nn.Module, ids: list[int]) -> float:
    """exp(mean negative log-likelihood) of ``ids`` under ``model``."""
    logits = model(mx.array([ids]))[0].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    picked = mx.take_along_axis(logprobs[:-1], mx.array(ids[1:])[:, None], axis=-1)
    return math.exp(-picked.mean().item())


def test_default_model_models_english(default_q4: LoadedModel) -> None:
    ids = default_q4.tokenizer.encode(PASSAGE)[:PERPLEXITY_TOKENS]
    assert len(ids) == PERPLEXITY_TOKENS
    assert perplexity(default_q4.model, ids) < PERPLEXITY_BOUND


def test_skipping_the_qk_unpermute_breaks_the_default_model(default_q4: LoadedModel) -> None:
    # Re-apply the converter's permutation on top of the loader's output: the
    # model must get much worse, so the bound above really tests the unpermute.
    ids = default_q4.tokenizer.encode(PASSAGE)[:24]  # about 7,600 then, against 85.9 unbroken
    model = load_model("default").model
    heads = default_q4.args["num_attention_heads"]
    for layer in model.layers:
        proj = layer.self_attn.q_proj
        proj.weight = mx.array(converter_permute_mx(proj.weight, heads))
        proj.scales = mx.array(converter_permute_mx(proj.scales, heads))
        proj.biases = mx.array(converter_permute_mx(proj.biases, heads))
    assert perplexity(model, ids) > 3 * PERPLEXITY_BOUND


def converter_permute_mx(w: mx.array, heads: int) -> mx.array:
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_default_model_stays_quantized(default_q4: LoadedModel) -> None:
    bits = {m.bits for _, m in default_q4.model.named_modules() if hasattr(m, "bits")}
    assert bits == {4, 8}  # Q4_1 matrices, Q8_0 token embedding
    assert isinstance(default_q4.model.layers[0].self_attn.q_proj, nn.QuantizedLinear)


def test_dequantized_logits_agree_with_quantized(default_q4: LoadedModel, default_f32: LoadedModel) -> None:
    ids = default_q4.tokenizer.encode(PASSAGE)[:24]
    a = default_q4.model(mx.array([ids]))[0].astype(mx.float32)
    b = default_f32.model(mx.array([ids]))[0]
    assert b.dtype == mx.float32
    diff = mx.abs(a - b)
    assert diff.max().item() < DEQUANTIZED_LOGIT_MAX_ATOL
    assert diff.mean().item() < DEQUANTIZED_LOGIT_MEAN_ATOL
    assert mx.array_equal(a.argmax(-1), b.argmax(-1)).item()


@pytest.mark.parametrize("matrix_type", ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"])
def test_tiny_gguf_matches_the_model_it_was_written_from(tmp_path: Path, matrix_type: str) -> None:
    model, args = tiny_llama(0, hidden_size=64)
    decoded = write_llama_gguf(model, args, tmp_path / "tiny.gguf", matrix_type=matrix_type)
    loaded = load_model(str(tmp_path / "tiny.gguf"))
    reference, _ = tiny_llama(0, hidden_size=64)
    reference.load_weights(list(decoded.items()))
    x = mx.array([[2, 3, 4, 5, 6, 7]])
    assert mx.abs(loaded.model(x) - reference(x)).max().item() < 1e-2
    quantized = isinstance(loaded.model.layers[0].mlp.up_proj, nn.QuantizedLinear)
    assert quantized == matrix_type.startswith("Q")


def test_a_float32_cast_dequantizes_in_float32(tmp_path: Path) -> None:
    # Q4_1 keeps float16 scales and minimums; llama.cpp computes each weight as d * q + m in float32.
    # Rounding it to float16 on the way (the default target's cast before 2026-11-28) moves it by up
    # to 5e-4 of its size, far over this bound.
    model, args = tiny_llama(0, hidden_size=64)
    write_llama_gguf(model, args, tmp_path / "tiny.gguf", matrix_type="Q4_1")
    packed = load_model(str(tmp_path / "tiny.gguf")).model.layers[0].mlp.up_proj
    dense = load_model(f"{tmp_path / 'tiny.gguf'}@float32").model.layers[0].mlp.up_proj
    assert packed.scales.dtype == mx.float16 and (packed.bits, packed.group_size) == (4, 32)
    q = (np.array(packed.weight)[..., None] >> np.arange(0, 32, 4, dtype=np.uint32)) & 0xF
    q = q.reshape(q.shape[0], -1, 32).astype(np.float32)
    scales = np.array(packed.scales.astype(mx.float32))[..., None]
    biases = np.array(packed.biases.astype(mx.float32))[..., None]
    expected = (scales * q + biases).reshape(q.shape[0], -1)
    assert np.abs(np.array(dense.weight) - expected).max() <= 1e-6 * np.abs(expected).max()


def test_tiny_gguf_without_unpermute_would_differ(tmp_path: Path) -> None:
    # The converter's permutation is not the identity on these shapes, so the
    # test above would catch a loader that skipped or misapplied the inverse.
    model, args = tiny_llama(0, hidden_size=64)
    w = np.array(model.layers[0].self_attn.q_proj.weight)
    assert not np.array_equal(converter_permute(w, args["num_attention_heads"]), w)


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path: Path) -> None:
    model, args = tiny_llama(0, hidden_size=256)
    path = tmp_path / "k_quant.gguf"
    write_llama_gguf(model, args, path, type_overrides={"blk.1.ffn_down.weight": "Q4_K"})
    with pytest.raises(UnsupportedModelError) as err:
        load_model(str(path))
    message = str(err.value)
    assert "'blk.1.ffn_down.weight'" in message and "Q4_K" in message
    assert "F32, F16, Q4_0, Q4_1, Q8_0" in message


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    model, args = tiny_llama(0)
    path = tmp_path / "qwen.gguf"
    write_llama_gguf(model, args, path, arch="qwen2")
    with pytest.raises(
        UnsupportedModelError, match=r"architecture 'qwen2' is not supported; supported: llama"
    ):
        load_model(str(path))


def test_truncated_file_is_a_format_error(tmp_path: Path) -> None:
    model, args = tiny_llama(0)
    path = tmp_path / "cut.gguf"
    write_llama_gguf(model, args, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ModelFormatError, match="truncated"):
        load_model(str(path))
