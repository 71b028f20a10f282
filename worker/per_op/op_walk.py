"""The operations of one forward pass of any mlx-lm model, found in the model's own modules.

The per-op baseline splits a pass where a GGML_RPC client would send
operations: at every call of a *leaf* module (one without sub-modules:
each ``Linear``/``QuantizedLinear``, norm, embedding, RoPE, convolution), at
the tied LM head (``Embedding.as_linear``), at each KV-cache write
(``update_and_fetch``) and at the kernels mlx-lm's models share
(``scaled_dot_product_attention``, ``gated_delta_update``), and at specwire's
own forms of those kernels, named as the kernel each stands in for (the
emulation's hybrid model runs a long run's delta rule as a scan on a CPU,
``specwire.models.delta_scan``: one ``gated_delta_update`` operation, as
mlx-lm's kernel is on its other path). The elementwise
work between two of them (residual adds, activations, reshapes) runs with
the next one, as it would in a fused kernel. Nothing here is written per
architecture: ``trace`` runs one pass and records where it stops, so
llama, Qwen2/2.5, Qwen3, Qwen3.5, Gemma 3, Mistral and Phi-3 are walked the
same way, and the pass computes exactly what the model computes, because it
*is* the model's own forward pass. The trace of a model with recurrent
layers records a prefill too, so one that takes another path for long runs
is refused when it is traced, not at a session's first prompt.

The pass runs in a greenlet (on the worker's compute thread, so MLX sees one
thread) that stops before each operation until the coordinator names it
(``PassRun.step``): a session's pass waits, suspended, between calls while
other sessions use the compute thread. The hooks act only inside such a
greenlet; the stream backend runs the same model unhooked in effect (one
dictionary lookup per module call).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial, wraps
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from greenlet import GreenletExit, getcurrent, greenlet
from mlx_lm.models.cache import make_prompt_cache

from specwire.emulation.pace import ROUND_POSITIONS
from specwire.errors import InvalidArgumentError, UnsupportedModelError
from specwire.models import delta_scan
from specwire.v1 import draft_pb2 as pb

KERNELS = ("scaled_dot_product_attention", "gated_delta_update")
# specwire's own forms of those kernels: (module, function, the kernel it is walked as).
STAND_INS = ((delta_scan, "scan_delta_rule", "gated_delta_update"),)
# The positions of the prefill ``trace`` records for a recurrent model: longer than any round's pass, so it
# takes the paths a prompt takes (a Gated DeltaNet layer's delta scan on a CPU).
PREFILL_POSITIONS = ROUND_POSITIONS + 1
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:[.:]|$)")

_RUNS: dict[greenlet, PassRun] = {}  # the passes being walked, by the greenlet that runs each
_NAMES: dict[int, str] = {}  # id(module) -> its path in the model
_HOOKED: dict[type, type] = {}


def layer_of(name: str) -> int | None:
    """The block an operation belongs to (``model.layers.3.mlp.up_proj`` -> 3), or None."""
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Walk:
    """One forward pass as the per-op baseline walks it: its operations' names, in order."""

    steps: tuple[str, ...]
    recurrent: bool  # some layer keeps a recurrent state (it rolls back only to a pass's end)

    @property
    def names(self) -> dict[str, int]:
        """A handle for each distinct operation name, in order of first use."""
        return {name: i for i, name in enumerate(dict.fromkeys(self.steps), start=1)}

    @property
    def ops_per_pass(self) -> int:
        """Operations of a pass: the token upload, the steps and the logits download."""
        return len(self.steps) + 2

    def announce(self) -> pb.TensorOpened:
        """The walk as a session's opening tells it to the coordinator (its identity left to fill)."""
        names = self.names
        return pb.TensorOpened(
            modules=[pb.ModuleHandle(name=n, handle=h) for n, h in names.items()],
            walk=[names[step] for step in self.steps],
            recurrent=self.recurrent,
        )


@dataclass
class PassRun:
    """One forward pass, suspended before each of its operations until it is told to run it."""

    run: Callable[[], mx.array]
    last_rows: int = 0  # >0: the head computes only these last positions (what GET_TENSOR returns)
    head: str = ""
    pending: str | None = None  # the operation the pass stops before; None once it has ended
    logits: mx.array | None = None
    scope: str = ""
    _greenlet: greenlet = field(init=False)

    def __post_init__(self) -> None:
        self._greenlet = greenlet(self._body)
        self._resume()  # up to the first operation

    def _body(self) -> mx.array:
        _RUNS[getcurrent()] = self
        try:
            return self.run()
        finally:
            _RUNS.pop(getcurrent(), None)

    def _resume(self) -> None:
        value = self._greenlet.switch()
        if self._greenlet.dead:
            self.pending, self.logits = None, value
            mx.eval(value)
        else:
            self.pending = value

    def step(self, name: str) -> bool:
        """Run the operation ``name`` (and the elementwise work up to the next); True if the pass ended."""
        if self.pending is None:
            raise InvalidArgumentError(f"the pass has ended; {name} is not part of it")
        if name != self.pending:
            raise InvalidArgumentError(f"the pass reaches {self.pending} next, not {name}")
        self._resume()
        return self.pending is None

    def abandon(self) -> None:
        """Drop a pass that will not be finished (its greenlet unwinds here, on this thread)."""
        if not self._greenlet.dead:
            self._greenlet.throw(GreenletExit)

    # Inside the pass's greenlet.

    def boundary(self, name: str, compute: Callable[..., Any], *args: Any) -> Any:
        """Stop before operation ``name``; once told to go on, run it and evaluate what it wrote."""
        if ":" not in name:  # a module: the kernels after it are named after its parent
            self.scope = name.rsplit(".", 1)[0]
        if name == self.head and self.last_rows and args and args[0].ndim == 3:
            args = (args[0][:, -self.last_rows :], *args[1:])  # only the rows GET_TENSOR returns
        parent = self._greenlet.parent
        assert parent is not None
        parent.switch(name)
        out = compute(*args)
        mx.eval(out)
        return out


class _Recorder:
    """Stands in for a PassRun while ``trace`` records a pass's operations (it never stops)."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.scope = ""

    def boundary(self, name: str, compute: Callable[..., Any], *args: Any) -> Any:
        if ":" not in name:
            self.scope = name.rsplit(".", 1)[0]
        self.steps.append(name)
        return compute(*args)


def _current() -> PassRun | _Recorder | None:
    return _RUNS.get(getcurrent()) if _RUNS else None


def _hooked_class(cls: type) -> type:
    """``cls`` with its call (and a tied head's ``as_linear``) stopping where a walked pass asks."""
    if cls in _HOOKED:
        return _HOOKED[cls]

    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        run = _current()
        if run is None:
            return cls.__call__(self, *args, **kwargs)
        return run.boundary(_NAMES[id(self)], lambda *a: cls.__call__(self, *a, **kwargs), *args)

    attrs: dict[str, Any] = {"__call__": __call__}
    if hasattr(cls, "as_linear"):

        def as_linear(self: nn.Module, x: mx.array) -> mx.array:
            run = _current()
            if run is None:
                return cls.as_linear(self, x)
            return run.boundary(f"{_NAMES[id(self)]}.as_linear", partial(cls.as_linear, self), x)

        attrs["as_linear"] = as_linear
    _HOOKED[cls] = type(cls.__name__, (cls,), {**attrs, "__module__": cls.__module__})
    return _HOOKED[cls]


def _hooked_kernel(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(fn)
    def kernel(*args: Any, **kwargs: Any) -> Any:
        run = _current()
        if run is None:
            return fn(*args, **kwargs)
        return run.boundary(f"{run.scope}:{kind}", lambda *a: fn(*a, **kwargs), *args)

    kernel._walked = True  # type: ignore[attr-defined]
    return kernel


def _hook_kernels() -> None:
    """Stop at the kernels mlx-lm's model files import (each file's own reference to them), and at
    specwire's stand-ins for them."""
    hooks: list[tuple[Any, str, str]] = list(STAND_INS)
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("mlx_lm.models."):
            hooks.extend((module, kind, kind) for kind in KERNELS)
    for module, name, kind in hooks:
        fn = getattr(module, name, None)
        if callable(fn) and not getattr(fn, "_walked", False):
            setattr(module, name, _hooked_kernel(kind, fn))


def hook_cache(cache: list[Any]) -> None:
    """Stop at each KV-cache write of a walked pass (``update_and_fetch``); recurrent caches have none."""
    for layer in cache:
        if hasattr(layer, "update_and_fetch") and not getattr(type(layer), "_walked", False):
            cls = type(layer)

            def update_and_fetch(self: Any, *args: Any, _cls: type = cls) -> Any:
                run = _current()
                if run is None:
                    return _cls.update_and_fetch(self, *args)  # type: ignore[attr-defined]
                return run.boundary(f"{run.scope}:kv_write", partial(_cls.update_and_fetch, self), *args)  # type: ignore[attr-defined]

            attrs = {"update_and_fetch": update_and_fetch, "_walked": True}
            layer.__class__ = type(cls.__name__, (cls,), {**attrs, "__module__": cls.__module__})


def hook(model: nn.Module) -> None:
    """Make ``model``'s leaf modules and mlx-lm's shared kernels stop where a walked pass asks."""
    for name, module in model.named_modules():
        if module.children() and any(_is_module_tree(v) for v in module.children().values()):
            continue  # not a leaf
        _NAMES[id(module)] = name
        if type(module) not in _HOOKED.values():
            module.__class__ = _hooked_class(type(module))
    _hook_kernels()


def _is_module_tree(value: Any) -> bool:
    """True if ``value`` (a child entry of a module) holds a module."""
    if isinstance(value, nn.Module):
        return True
    if isinstance(value, (list, tuple)):
        return any(_is_module_tree(v) for v in value)
    if isinstance(value, dict):
        return any(_is_module_tree(v) for v in value.values())
    return False


def _record(model: nn.Module, cache: list[Any], token: int, positions: int = 1) -> list[str]:
    """The operations one pass of ``positions`` copies of ``token`` stops at."""
    recorder = _Recorder()
    runner = greenlet(lambda: model(mx.array([[token] * positions]), cache=cache))
    _RUNS[runner] = recorder  # type: ignore[assignment]
    try:
        mx.eval(runner.switch())
    except Exception as err:  # any failure means the pass cannot be walked here
        raise UnsupportedModelError(f"the per-op baseline cannot split this model's pass: {err}") from err
    finally:
        _RUNS.pop(runner, None)
    return recorder.steps


def _parting(first: list[str], second: list[str]) -> str | None:
    """The first operation where two passes' walks part, or None if they are the same."""
    if first == second:
        return None
    longer = first if len(first) > len(second) else second
    return next(
        (a for a, b in zip(first, second, strict=False) if a != b), longer[min(len(first), len(second))]
    )


def trace(model: nn.Module) -> Walk:
    """Hook ``model`` and record the operations of its pass; refuses a pass that cannot be split.

    A walk must stop at the same operations every pass. Two one-position
    passes are recorded: a module called inside a compiled function stops
    the first (which traces it) but not the second (which replays it). A
    model with recurrent layers records a prefill too, of ``PREFILL_POSITIONS``:
    such a layer may run a long run of positions another way (the emulation's
    delta scan), and must still stop where a one-position pass does. (An
    attention model's prefill is the same operations at another shape, and
    on a CPU costs seconds for the default model.)
    """
    hook(model)
    cache = make_prompt_cache(model)
    hook_cache(cache)
    first, second = _record(model, cache, 0), _record(model, cache, 1)
    if where := _parting(first, second):
        raise UnsupportedModelError(
            f"the per-op baseline cannot split this model's pass at {where}: it stops there in one pass and "
            "not the next (a compiled function?)"
        )
    recurrent = any(not hasattr(c, "update_and_fetch") for c in cache)
    if recurrent and (where := _parting(first, _record(model, cache, 1, PREFILL_POSITIONS))):
        raise UnsupportedModelError(
            f"the per-op baseline cannot split this model's pass at {where}: a pass of one position and a "
            f"prefill of {PREFILL_POSITIONS} part there (a path for long runs the walk does not stop in)"
        )
    layers = len(getattr(model, "layers", []))
    walked = {layer_of(step) for step in first} - {None}
    missing = [i for i in range(layers) if i not in walked]
    if missing:
        raise UnsupportedModelError(
            f"the per-op baseline cannot split block {missing[0]} of this model: its pass calls no module "
            "or kernel there that the walk can stop at (a compiled or fused block)"
        )
    return Walk(tuple(first), recurrent)
