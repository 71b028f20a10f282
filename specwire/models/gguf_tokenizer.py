"""Rebuilds a Hugging Face tokenizer from the metadata of a GGUF file.

GGUF stores a byte-level BPE vocabulary as ``tokenizer.ggml.tokens`` (in the
same byte-to-unicode spelling as ``tokenizer.json``), its merges, token types
(normal, control, user-defined), the BOS/EOS ids and the chat template. The
pre-tokenizer is only named (``tokenizer.ggml.pre``); the table below maps the
names we support to the equivalent ``tokenizers`` pre-tokenizer, matching the
split expressions llama.cpp uses for each name.

The result is wrapped in mlx-lm's ``TokenizerWrapper`` with its streaming BPE
detokenizer, so the rest of specwire sees the same interface as for a model
loaded by ``mlx_lm.load``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from specwire.errors import UnsupportedModelError

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _llama3() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# tokenizer.ggml.pre -> pre-tokenizer. The digit-splitting family shares one
# expression in llama.cpp: each digit is its own word, then the GPT-2 split.
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "default": _gpt2,
    "gpt-2": _gpt2,
    "gpt2": _gpt2,
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
    "llama-bpe": _llama3,
    "llama3": _llama3,
}


def _meta_int(metadata: dict[str, Any], key: str) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    return int(value.item()) if hasattr(value, "item") else int(value)


def _meta_bool(metadata: dict[str, Any], key: str, default: bool) -> bool:
    value = metadata.get(key)
    if value is None:
        return default
    return bool(value.item()) if hasattr(value, "item") else bool(value)


def _special_tokens(tokens: list[str], token_types: list[int]) -> list[AddedToken]:
    return [
        AddedToken(tokens[i], special=(t == TOKEN_TYPE_CONTROL), normalized=False)
        for i, t in enumerate(token_types)
        if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    ]


def build_tokenizer(metadata: dict[str, Any], source: str) -> TokenizerWrapper:
    """Build the tokenizer a GGUF file describes; ``source`` names the file in errors."""
    model_kind = metadata.get("tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise UnsupportedModelError(
            f"{source}: tokenizer model {model_kind!r} is not supported; supported: 'gpt2' (byte-level BPE)"
        )
    pre = str(metadata.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"{source}: pre-tokenizer {pre!r} is not supported; "
            f"supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    token_types: Any = metadata.get("tokenizer.ggml.token_type", [1] * len(tokens))
    types = list(token_types.tolist() if hasattr(token_types, "tolist") else token_types)

    bpe = models.BPE(
        vocab={tok: i for i, tok in enumerate(tokens)},
        merges=merges,
        fuse_unk=False,
        ignore_merges=pre in ("llama-bpe", "llama3"),
    )
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(_special_tokens(tokens, types))

    bos = _meta_int(metadata, "tokenizer.ggml.bos_token_id")
    eos = _meta_int(metadata, "tokenizer.ggml.eos_token_id")
    if bos is not None and _meta_bool(metadata, "tokenizer.ggml.add_bos_token", False):
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A",
            pair=f"{tokens[bos]} $A $B",
            special_tokens=[(tokens[bos], bos)],
        )

    named = {
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": _meta_int(metadata, "tokenizer.ggml.unknown_token_id"),
        "pad_token": _meta_int(metadata, "tokenizer.ggml.padding_token_id"),
    }
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        chat_template=metadata.get("tokenizer.chat_template"),
        **{name: tokens[i] for name, i in named.items() if i is not None and 0 <= i < len(tokens)},
    )
    return TokenizerWrapper(
        hf,
        detokenizer_class=BPEStreamingDetokenizer,
        eos_token_ids=[eos] if eos is not None else None,
    )
