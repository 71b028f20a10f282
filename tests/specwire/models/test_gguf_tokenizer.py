"""The tokenizer rebuilt from GGUF metadata (real default model)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specwire.errors import UnsupportedModelError
from specwire.models.loading import LoadedModel, load_model
from tests.support.models.gguf_models import write_llama_gguf
from tests.support.models.tiny_models import tiny_llama

SAMPLES = [
    "Hello world! The year 2024 costs $12.50.",
    "def f(x):\n\treturn x ** 2  # square\n",
    "Ünïcødé, 日本語, emoji 🙂 and   spaces",
    "",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip(default_q4: LoadedModel, text: str) -> None:
    tok = default_q4.tokenizer
    assert tok.decode(tok.encode(text)) == text


def test_bpe_merges_are_applied(default_q4: LoadedModel) -> None:
    # Common words are single tokens only if the merges were loaded.
    assert len(default_q4.tokenizer.encode(" the")) == 1
    assert len(default_q4.tokenizer.encode(" village")) == 1


def test_smollm_pretokenizer_splits_digits(default_q4: LoadedModel) -> None:
    tok = default_q4.tokenizer
    ids = tok.encode("2024")
    assert [tok.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_control_tokens_and_special_ids(default_q4: LoadedModel) -> None:
    tok = default_q4.tokenizer
    assert tok.encode("<|im_start|>user") == [1, tok.encode("user")[0]]
    assert tok.bos_token_id == 1 and tok.eos_token_id == 2
    assert default_q4.eos_token_ids == frozenset({2})


def test_chat_template(default_q4: LoadedModel) -> None:
    tok = default_q4.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_streaming_detokenizer_matches_decode(default_q4: LoadedModel) -> None:
    tok = default_q4.tokenizer
    ids = tok.encode(SAMPLES[2])
    detok = tok.detokenizer
    detok.reset()
    for i in ids:
        detok.add_token(i)
    detok.finalize()
    assert detok.text == SAMPLES[2]


def test_unknown_pretokenizer_is_refused(tmp_path: Path) -> None:
    model, args = tiny_llama(0)
    path = tmp_path / "odd.gguf"
    write_llama_gguf(model, args, path)
    data = path.read_bytes().replace(
        b"\x07\x00\x00\x00\x00\x00\x00\x00default", b"\x07\x00\x00\x00\x00\x00\x00\x00mystery"
    )
    path.write_bytes(data)
    with pytest.raises(UnsupportedModelError, match="pre-tokenizer 'mystery' is not supported; supported: "):
        load_model(str(path))


def test_models_of_one_file_share_its_tokenizer_until_the_file_changes(tmp_path: Path) -> None:
    model, args = tiny_llama(0)
    path = tmp_path / "pair.gguf"
    write_llama_gguf(model, args, path)
    draft, target = load_model(str(path)), load_model(f"{path}@float32")
    assert draft.tokenizer is target.tokenizer
    written = path.stat()
    os.utime(path, ns=(written.st_atime_ns, written.st_mtime_ns + 1_000_000))  # as a rewrite would
    assert load_model(str(path)).tokenizer is not draft.tokenizer
