"""The per-op baseline's executor: one session's activations and KV cache, and its operations.

Each operation calls the very module or kernel mlx-lm's llama model uses at
that step (the same ``Linear``/``QuantizedLinear``, ``RMSNorm``, ``RoPE``,
``KVCache.update_and_fetch`` and scaled-dot-product attention), so a forward
pass walked op by op computes the same numbers as the model run whole. Every
operation is checked before it runs: its code, the number of inputs,
outputs and args, and every handle (activations must carry this session's
tag; modules must be of the right kind). A bad operation raises
``InvalidArgumentError`` and leaves the worker's other sessions untouched.

All methods run where the worker computes (its event loop or its compute thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from specwire.errors import InvalidArgumentError
from specwire.models import LoadedModel
from specwire.pace import ROUND_POSITIONS, Pacer
from specwire.v1 import draft_pb2 as pb

TAG_SHIFT = 32
MAX_SLOTS = 256
_LINEAR = (nn.Linear, nn.QuantizedLinear)
_EMBEDDING = (nn.Embedding, nn.QuantizedEmbedding)


@dataclass
class ModuleTable:
    """Fixed handles for the modules of a llama model, shared by all sessions."""

    modules: dict[int, nn.Module]
    names: dict[str, int]
    layer_of: dict[int, int]

    @classmethod
    def of(cls, model: nn.Module) -> ModuleTable:
        """Number the modules a llama forward pass uses, in a stable order."""
        named: list[tuple[str, nn.Module, int | None]] = [
            ("model.embed_tokens", model.model.embed_tokens, None)
        ]
        for i, layer in enumerate(model.model.layers):
            prefix = f"model.layers.{i}"
            named.append((f"{prefix}.input_layernorm", layer.input_layernorm, i))
            named.append((f"{prefix}.self_attn", layer.self_attn, i))
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                named.append((f"{prefix}.self_attn.{proj}", getattr(layer.self_attn, proj), i))
            named.append((f"{prefix}.post_attention_layernorm", layer.post_attention_layernorm, i))
            for proj in ("gate_proj", "up_proj", "down_proj"):
                named.append((f"{prefix}.mlp.{proj}", getattr(layer.mlp, proj), i))
        named.append(("model.norm", model.model.norm, None))
        if "lm_head" in model:
            named.append(("lm_head", model.lm_head, None))
        table = cls({}, {}, {})
        for handle, (name, module, layer) in enumerate(named, start=1):
            table.modules[handle] = module
            table.names[name] = handle
            if layer is not None:
                table.layer_of[handle] = layer
        return table


@dataclass
class Executed:
    """What one graph produced, and when its compute started and ended (ns)."""

    tensors: list[bytes]
    started_ns: int
    finished_ns: int


@dataclass
class TensorSession:
    """One session of the tensor executor."""

    model: LoadedModel
    table: ModuleTable
    tag: int
    cache: list = field(default_factory=list)
    store: dict[int, mx.array] = field(default_factory=dict)
    graphs: int = 0
    ops: int = 0
    tensor_bytes: int = 0
    forward_passes: int = 0
    pacer: Pacer | None = None
    ops_per_pass: int = 1
    paced_passes: int = 0
    pace_overruns: int = 0
    _positions: int = 1
    _pass_real_s: float = 0.0
    _pass_paced_s: float = 0.0
    _pass_lag_s: float = 0.0

    def __post_init__(self) -> None:
        self.cache = make_prompt_cache(self.model.model)
        self._ops: dict[int, Callable[[pb.Op], list[bytes]]] = {
            pb.SET_TENSOR: self._set_tensor,
            pb.GET_TENSOR: self._get_tensor,
            pb.EMBED: self._embed,
            pb.RMS_NORM: self._rms_norm,
            pb.MATMUL: self._matmul,
            pb.ROPE: self._rope,
            pb.KV_WRITE: self._kv_write,
            pb.ATTENTION: self._attention,
            pb.ADD: lambda op: self._binary(op, mx.add),
            pb.MUL: lambda op: self._binary(op, mx.multiply),
            pb.SILU: self._silu,
            pb.LM_HEAD: self._lm_head,
            pb.KV_TRIM: self._kv_trim,
            pb.ARGMAX: self._argmax,
        }

    def execute(self, ops: Sequence[pb.Op]) -> Executed:
        """Run ``ops`` in order, evaluate everything they wrote, return the requested tensors.

        Paced (``pacer``), the call is then held for its operations' share of
        the paced time of the passes they belong to (a pass's time spread evenly
        over its ``ops_per_pass`` operations), and each pass that ends here is
        counted, as an overrun if any of its calls overran.
        """
        started_ns, started = time.perf_counter_ns(), time.perf_counter()
        tensors: list[bytes] = []
        written: dict[int, mx.array] = {}
        paced_s, ended = 0.0, 0
        for index, op in enumerate(ops):
            run = self._ops.get(op.code)
            if run is None:
                raise InvalidArgumentError(f"op {index}: unknown op code {op.code}")
            try:
                tensors.extend(run(op))
            except InvalidArgumentError as err:
                raise InvalidArgumentError(f"op {index} ({pb.OpCode.Name(op.code)}): {err}") from err
            except (ValueError, RuntimeError, IndexError) as err:  # shapes MLX rejects
                raise InvalidArgumentError(f"op {index} ({pb.OpCode.Name(op.code)}) failed: {err}") from err
            written.update((h, self.store[h]) for h in op.outputs if h in self.store)
            self.ops += 1
            paced_s += self._share(op)
            ended += op.code == pb.LM_HEAD
        mx.eval(list(written.values()))
        if self.pacer is not None:
            self._pace(started, paced_s, ended)
        self.graphs += 1
        self.tensor_bytes += sum(len(t) for t in tensors)
        return Executed(tensors, started_ns, time.perf_counter_ns())

    def _share(self, op: pb.Op) -> float:
        """This operation's part of its pass's paced time (none for the bookkeeping ops)."""
        if op.code == pb.SET_TENSOR:
            self._positions = int(op.args[0])
        elif op.code == pb.ARGMAX:
            self._positions = 1  # the chained pass after it feeds one token
        if self.pacer is None or op.code in (pb.KV_TRIM, pb.ARGMAX):
            return 0.0
        return self.pacer.curve.pass_s(self._positions) / self.ops_per_pass

    def _pace(self, started: float, paced_s: float, ended: int) -> None:
        """Hold this call for its share of its pass, less what earlier calls of the pass ran over.

        A pass's calls together keep the device busy for max(its paced time, their
        real compute): an operation slower than its even share (the LM head) is
        made up by the faster ones after it. A pass overran when its calls' real
        compute, together, took longer than its paced time.
        """
        assert self.pacer is not None
        compute_s = time.perf_counter() - started
        due = max(0.0, paced_s - self._pass_lag_s)
        late = self.pacer.hold(started, due)
        self._pass_lag_s = max(0.0, self._pass_lag_s + compute_s - paced_s) if late else 0.0
        self._pass_real_s += compute_s
        self._pass_paced_s += paced_s
        for _ in range(ended):
            overran = self._pass_real_s > self._pass_paced_s
            self.pacer.record(self._pass_real_s, self._pass_paced_s, overran)
            self.paced_passes += 1
            self.pace_overruns += overran
            self._pass_real_s = self._pass_paced_s = self._pass_lag_s = 0.0

    # Handles.

    def _slot(self, handle: int) -> int:
        tag, slot = handle >> TAG_SHIFT, handle & ((1 << TAG_SHIFT) - 1)
        if tag != self.tag:
            raise InvalidArgumentError(f"handle {handle:#x} belongs to another session")
        if slot >= MAX_SLOTS:
            raise InvalidArgumentError(f"handle {handle:#x}: slot {slot} is outside 0..{MAX_SLOTS - 1}")
        return slot

    def _get(self, handle: int) -> mx.array:
        self._slot(handle)
        if handle not in self.store:
            raise InvalidArgumentError(f"handle {handle:#x} holds no tensor in this session")
        return self.store[handle]

    def _put(self, handle: int, value: mx.array) -> None:
        self._slot(handle)
        self.store[handle] = value

    def _module(self, handle: int, kinds: tuple[type, ...], what: str) -> nn.Module:
        module = self.table.modules.get(handle)
        if module is None or not isinstance(module, kinds):
            raise InvalidArgumentError(f"handle {handle:#x} is not a {what} of this model")
        return module

    def _layer(self, handle: int) -> int:
        return self.table.layer_of[handle]

    @staticmethod
    def _shape(op: pb.Op, outputs: int, inputs: int, args: int) -> None:
        if (len(op.outputs), len(op.inputs), len(op.args)) != (outputs, inputs, args):
            raise InvalidArgumentError(
                f"takes {outputs} outputs, {inputs} inputs and {args} args; "
                f"got {len(op.outputs)}, {len(op.inputs)} and {len(op.args)}"
            )

    def _offset(self, layer: int, offset: int) -> None:
        if offset != self.cache[layer].offset:
            raise InvalidArgumentError(
                f"position {offset} does not match layer {layer}'s cache ({self.cache[layer].offset})"
            )

    # Operations: each returns the tensors it was asked to send back.

    def _set_tensor(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 1, 0, 1)
        if len(op.data) != 4 * op.args[0] or op.args[0] < 1:
            raise InvalidArgumentError(f"expects {op.args[0]} int32 token ids, got {len(op.data)} bytes")
        ids = np.frombuffer(op.data, dtype="<i4")
        if ids.min() < 0 or ids.max() >= self.model.vocab_size:
            raise InvalidArgumentError(f"token ids must lie in 0..{self.model.vocab_size - 1}")
        self._put(op.outputs[0], mx.array(ids.astype(np.int32))[None])
        return []

    def _get_tensor(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 0, 1, 0)
        x = self._get(op.inputs[0])
        if x.ndim != 3:
            raise InvalidArgumentError(f"expects a [batch, positions, features] tensor, got shape {x.shape}")
        return [np.array(x[0, -1].astype(mx.float32)).tobytes()]

    def _embed(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 1, 2, 0)
        embed = self._module(op.inputs[1], _EMBEDDING, "token embedding")
        self._put(op.outputs[0], embed(self._get(op.inputs[0])))
        return []

    def _rms_norm(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 1, 2, 0)
        norm = self._module(op.inputs[1], (nn.RMSNorm,), "RMSNorm")
        self._put(op.outputs[0], norm(self._get(op.inputs[0])))
        return []

    def _matmul(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 1, 2, 0)
        linear = self._module(op.inputs[1], _LINEAR, "linear layer")
        self._put(op.outputs[0], linear(self._get(op.inputs[0])))
        return []

    def _attention_module(self, handle: int) -> nn.Module:
        module = self.table.modules.get(handle)
        if module is None or not hasattr(module, "rope"):
            raise InvalidArgumentError(f"handle {handle:#x} is not an attention module of this model")
        return module

    def _rope(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 1, 2, 2)
        attn = self._attention_module(op.inputs[1])
        heads, offset = op.args
        self._offset(self._layer(op.inputs[1]), offset)
        x = self._get(op.inputs[0])
        b, length, _ = x.shape
        heads_first = x.reshape(b, length, heads, -1).transpose(0, 2, 1, 3)
        self._put(op.outputs[0], attn.rope(heads_first, offset=offset))
        return []

    def _kv_write(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 2, 2, 3)
        layer, kv_heads, offset = op.args
        if not 0 <= layer < len(self.cache):
            raise InvalidArgumentError(f"layer {layer} is outside 0..{len(self.cache) - 1}")
        self._offset(layer, offset)
        keys, values = self._get(op.inputs[0]), self._get(op.inputs[1])
        b, length, _ = values.shape
        values = values.reshape(b, length, kv_heads, -1).transpose(0, 2, 1, 3)
        all_keys, all_values = self.cache[layer].update_and_fetch(keys, values)
        self._put(op.outputs[0], all_keys)
        self._put(op.outputs[1], all_values)
        return []

    def _attention(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 1, 4, 0)
        attn = self._attention_module(op.inputs[3])
        layer = self._layer(op.inputs[3])
        queries = self._get(op.inputs[0])
        b, _, length, _ = queries.shape
        mask = self.cache[layer].make_mask(length, return_array=False, window_size=None)
        out = scaled_dot_product_attention(
            queries,
            self._get(op.inputs[1]),
            self._get(op.inputs[2]),
            cache=self.cache[layer],
            scale=attn.scale,
            mask=mask,
        )
        self._put(op.outputs[0], out.transpose(0, 2, 1, 3).reshape(b, length, -1))
        return []

    def _binary(self, op: pb.Op, fn: Callable[[mx.array, mx.array], mx.array]) -> list[bytes]:
        self._shape(op, 1, 2, 0)
        self._put(op.outputs[0], fn(self._get(op.inputs[0]), self._get(op.inputs[1])))
        return []

    def _silu(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 1, 1, 0)
        self._put(op.outputs[0], nn.silu(self._get(op.inputs[0])))
        return []

    def _lm_head(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 1, 2, 0)
        head = self._module(op.inputs[1], (*_EMBEDDING, *_LINEAR), "LM head")
        x = self._get(op.inputs[0])
        if x.ndim == 3 and x.shape[1] > ROUND_POSITIONS:
            x = x[:, -1:]  # a prefill: GET_TENSOR returns the last position's row, so only it is computed
        self._put(op.outputs[0], head.as_linear(x) if isinstance(head, _EMBEDDING) else head(x))
        self.forward_passes += 1
        return []

    def _kv_trim(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 0, 0, 1)
        n = op.args[0]
        if not 0 <= n <= self.cache[0].offset:
            raise InvalidArgumentError(f"cannot trim {n} positions from a cache of {self.cache[0].offset}")
        trim_prompt_cache(self.cache, n)
        return []

    def _argmax(self, op: pb.Op) -> list[bytes]:
        self._shape(op, 1, 1, 0)
        logits = self._get(op.inputs[0])
        self._put(op.outputs[0], mx.argmax(logits[:, -1, :], axis=-1)[None])
        return []
