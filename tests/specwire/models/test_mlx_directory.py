"""Models in mlx-lm's own format load through the same ``load_model``."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import save_config, save_model

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.local import LocalDraftSource
from specwire.drafting.sampling import SamplingParams
from specwire.errors import ModelNotFoundError
from specwire.models.loading import LoadedModel, load_model
from specwire.models.tiny_hybrid import build_tiny_hybrid
from tests.support.models.tiny_models import tiny_llama
from tests.support.prompts import ar_tokens
from tests.support.rounding import assert_lossless, rounding_gap


def save_tiny(path: Path, tokenizer: object, quantize: bool = False) -> nn.Module:
    """Save a random tiny llama with the default model's tokenizer, as mlx-lm does."""
    model, args = tiny_llama(3, vocab_size=49152, hidden_size=64)
    config = dict(args)
    if quantize:
        nn.quantize(model, group_size=32, bits=4)
        config["quantization"] = {"group_size": 32, "bits": 4}
    save_model(path, model)
    save_config(config, config_path=path / "config.json")
    tokenizer.save_pretrained(str(path))  # type: ignore[attr-defined]
    return model


def test_mlx_directory_loads_with_same_weights(tmp_path: Path, default_q4: LoadedModel) -> None:
    original = save_tiny(tmp_path, default_q4.tokenizer)
    loaded = load_model(str(tmp_path))
    x = mx.array([[1, 2, 3, 4]])
    assert mx.array_equal(loaded.model(x), original(x)).item()
    assert loaded.args["model_type"] == "llama"
    assert loaded.tokenizer.encode("Hello world") == default_q4.tokenizer.encode("Hello world")


def test_same_tokenizer_gives_same_fingerprint_across_formats(
    tmp_path: Path, default_q4: LoadedModel
) -> None:
    save_tiny(tmp_path, default_q4.tokenizer)
    assert load_model(str(tmp_path)).fingerprint == default_q4.fingerprint


def test_quantized_directory_can_be_dequantized(tmp_path: Path, default_q4: LoadedModel) -> None:
    save_tiny(tmp_path, default_q4.tokenizer, quantize=True)
    quantized = load_model(str(tmp_path))
    assert isinstance(quantized.model.layers[0].mlp.up_proj, nn.QuantizedLinear)
    dense = load_model(f"{tmp_path}@float32")
    assert type(dense.model.layers[0].mlp.up_proj) is nn.Linear
    assert dense.precision == "float32"
    # The same function up to this backend's rounding: 1e-3 on the CPU; on a GPU a float32 matmul
    # rounds further (an H100 measured 0.03 between batched and single passes of the default
    # target), so the bound is four times what this model's own passes round apart, if more.
    x = mx.array([[5, 6, 7]])
    tolerance = max(1e-3, 4 * rounding_gap(dense, [5, 6, 7], positions=2))
    assert mx.abs(dense.model(x) - quantized.model(x)).max().item() < tolerance


def test_a_hybrid_directory_loads_and_runs_as_saved(tmp_path: Path, default_q4: LoadedModel) -> None:
    # A Qwen3.5-layout model (a Gated DeltaNet layer, then full attention) saved as mlx-lm
    # saves one, then loaded through mlx_lm.load by its directory, as a real checkpoint would be.
    original, args = build_tiny_hybrid(default_q4.vocab_size, outputs=default_q4.vocab_size)
    save_model(tmp_path, original)
    save_config(dict(args), config_path=tmp_path / "config.json")
    default_q4.tokenizer.save_pretrained(str(tmp_path))
    loaded = load_model(str(tmp_path))
    assert loaded.args["model_type"] == "qwen3_5" and loaded.fingerprint == default_q4.fingerprint
    caches = [type(c).__name__ for c in make_prompt_cache(loaded.model)]
    assert caches == ["ArraysCache", "KVCache"]
    x = mx.array([[1, 2, 3, 4]])
    assert mx.array_equal(loaded.model(x), original(x)).item()
    prompt = loaded.tokenizer.encode("The lighthouse keeper")
    decoder = SpeculativeDecoder(loaded, LocalDraftSource(load_model("tiny-hybrid-draft")))
    result = decoder.generate(prompt, max_tokens=12, k=3, params=SamplingParams())
    assert_lossless(loaded, prompt, ar_tokens(loaded, prompt, 12), result.tokens)


def test_directory_without_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ModelNotFoundError, match="not an mlx-lm model directory"):
        load_model(str(tmp_path))
