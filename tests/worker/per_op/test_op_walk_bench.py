"""The bench's per-op rows on a saved model of each architecture the walk covers: lossless and verified.

Each model is one of mlx-lm's own classes with random weights and the
default model's tokenizer, saved to disk as mlx-lm saves models, served by a
real worker, and benched per op (one call per operation) against itself as
the target, so every draft is accepted and the row's output must equal AR's.
llama's per-op rows are benched in ``tests/coordinator/bench/test_bench_json.py``
(Mistral is llama's class in mlx-lm, and Qwen2 llama's blocks with biases,
walked bit-exact in ``tests/worker/per_op/test_op_walk.py``), Qwen3.5's in
``tests/coordinator/commands/test_hybrid_paths.py`` and the README's Qwen3
pair in ``tests/test_readme.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.utils import save_config, save_model

from specwire.models.loading import LoadedModel
from tests.support.processes.cli import run_cli
from tests.support.processes.workers import running_worker, unique_name
from tests.worker.per_op.test_op_walk import ARCHITECTURES, build


@pytest.mark.parametrize("architecture", ["gemma3", "phi3"])
def test_the_per_op_row_is_lossless_and_verified(
    architecture: str, tmp_path: Path, tiny: LoadedModel
) -> None:
    module, args, per_block = ARCHITECTURES[architecture]
    args: dict[str, Any] = {**args, "vocab_size": tiny.vocab_size}
    model = build(module, args)
    mx.eval(model.parameters())
    save_model(tmp_path / "model", model)
    save_config(args, config_path=tmp_path / "model" / "config.json")
    tiny.tokenizer.save_pretrained(str(tmp_path / "model"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The sky is blue because\n")
    with running_worker("--model", str(tmp_path / "model"), "--name", unique_name(architecture)) as worker:
        assert worker.ready["backends"] == ["stream", "ggml-rpc"]
        out = run_cli(
            "coordinator", "bench", "--workers", worker.address, "--target", str(tmp_path / "model"),
            "--backend", "ggml-rpc", "--granularity", "op", "--max-tokens", "8", "--k", "2",
            "--prompts", str(prompts), "--no-chat", "--json", str(tmp_path / "bench.json"),
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    bench = json.loads((tmp_path / "bench.json").read_text())
    (row,) = [r for r in bench["rows"] if r["backend"] == "ggml-rpc"]
    assert row["lossless"] is True and row["verified"] is True, row["label"]
    assert bench["workers"][0]["ops_per_pass"] == per_block * args["num_hidden_layers"] + 5
