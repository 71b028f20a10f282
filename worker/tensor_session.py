"""The per-op baseline's executor: one session's activations and cache, and its operations.

Each operation calls the very module or kernel mlx-lm's model uses at that
step (the same ``Linear``/``QuantizedLinear``, ``RMSNorm``, ``RoPE``, KV
cache, attention and, for Qwen3.5's Gated DeltaNet layers, the same
convolution and delta rule: ``worker.tensor_attention``,
``worker.tensor_gated``), so a forward pass walked op by op computes the
same numbers as the model run whole. Every operation is checked before it
runs: its code, the number of inputs, outputs and args, and every handle
(activations must carry this session's tag; modules must be of the right
kind). A bad operation raises ``InvalidArgumentError`` and leaves the
worker's other sessions untouched.

A hybrid model's recurrent layers cannot be trimmed: the session keeps
their state at the end of each forward pass (references, as
``specwire.drafting.rollback`` does for a local drafter), the last ``MAX_KEPT`` of
them, and KV_TRIM rolls back to one of those.

All methods run on the worker's compute thread (``specwire.process.compute``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from specwire.drafting.rollback import Checkpoints
from specwire.emulation.pace import ROUND_POSITIONS, Pacer, headroom_bucket
from specwire.errors import InvalidArgumentError
from specwire.models import LoadedModel
from specwire.v1 import draft_pb2 as pb
from worker import tensor_attention, tensor_gated
from worker.tensor_modules import ModuleTable

TAG_SHIFT = 32
MAX_SLOTS = 256
MAX_KEPT = 2 * ROUND_POSITIONS  # recurrent states kept: enough to roll back any draft round
_LINEAR = (nn.Linear, nn.QuantizedLinear)
_EMBEDDING = (nn.Embedding, nn.QuantizedEmbedding)
UNSPOKEN = -1e30  # the logit of an id an emulation model does not speak, in a row GET_TENSOR ships


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
    pace_buckets: list[int] = field(default_factory=list)  # the paced passes' buckets not yet reported
    _logits: set[int] = field(default_factory=set)  # handles an LM_HEAD wrote
    _positions: int = 1
    _pass_real_s: float = 0.0
    _pass_paced_s: float = 0.0
    _pass_lag_s: float = 0.0

    def __post_init__(self) -> None:
        self.cache = make_prompt_cache(self.model.model)
        self.checkpoints = Checkpoints(self.cache)
        self.recurrent = {i: 0 for i, kind in enumerate(self.checkpoints.kinds) if kind == "arrays"}
        self._ops: dict[int, Callable[[pb.Op], list[bytes]]] = {
            pb.SET_TENSOR: self._set_tensor,
            pb.GET_TENSOR: self._get_tensor,
            pb.EMBED: self._embed,
            pb.RMS_NORM: self._rms_norm,
            pb.MATMUL: self._matmul,
            pb.ADD: lambda op: self._binary(op, mx.add),
            pb.MUL: lambda op: self._binary(op, mx.multiply),
            pb.SILU: self._silu,
            pb.LM_HEAD: self._lm_head,
            pb.KV_TRIM: self._kv_trim,
            pb.ARGMAX: self._argmax,
        }
        for module in (tensor_attention, tensor_gated):
            self._ops.update({code: partial(run, self) for code, run in module.OPS.items()})

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
            except (ValueError, RuntimeError, IndexError, OverflowError) as err:  # shapes MLX rejects
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
            bucket = headroom_bucket(self._pass_real_s, self._pass_paced_s)
            self.pacer.record(self._pass_real_s, self._pass_paced_s, overran)
            self.paced_passes += 1
            self.pace_overruns += overran
            self.pace_buckets.append(bucket)
            self._pass_real_s = self._pass_paced_s = self._pass_lag_s = 0.0

    # Handles.

    def _slot(self, handle: int) -> int:
        tag, slot = handle >> TAG_SHIFT, handle & ((1 << TAG_SHIFT) - 1)
        if tag != self.tag:
            raise InvalidArgumentError(f"handle {handle:#x} belongs to another session")
        if slot >= MAX_SLOTS:
            raise InvalidArgumentError(f"handle {handle:#x}: slot {slot} is outside 0..{MAX_SLOTS - 1}")
        return slot

    def get(self, handle: int) -> mx.array:
        self._slot(handle)
        if handle not in self.store:
            raise InvalidArgumentError(f"handle {handle:#x} holds no tensor in this session")
        return self.store[handle]

    def take_pace_buckets(self) -> list[int]:
        """The headroom buckets of the passes that ended since the last call (each reply reports its own)."""
        taken, self.pace_buckets = self.pace_buckets, []
        return taken

    def put(self, handle: int, value: mx.array) -> None:
        self._slot(handle)
        self.store[handle] = value
        self._logits.discard(handle)

    def module(self, handle: int, kinds: tuple[type, ...], what: str) -> nn.Module:
        module = self.table.modules.get(handle)
        if module is None or not isinstance(module, kinds):
            raise InvalidArgumentError(f"handle {handle:#x} is not a {what} of this model")
        return module

    def layer(self, handle: int) -> int:
        """The layer a module belongs to."""
        if handle not in self.table.layer_of:
            raise InvalidArgumentError(f"handle {handle:#x} is not a module of one layer")
        return self.table.layer_of[handle]

    @staticmethod
    def shape(op: pb.Op, outputs: int, inputs: int, args: int) -> None:
        """Check the operation's numbers of outputs, inputs and args."""
        if (len(op.outputs), len(op.inputs), len(op.args)) != (outputs, inputs, args):
            raise InvalidArgumentError(
                f"takes {outputs} outputs, {inputs} inputs and {args} args; "
                f"got {len(op.outputs)}, {len(op.inputs)} and {len(op.args)}"
            )

    def check_offset(self, layer: int, offset: int) -> None:
        """Check that an attention layer's KV cache holds exactly ``offset`` positions."""
        held = getattr(self.cache[layer], "offset", None)
        if offset != held:
            raise InvalidArgumentError(f"position {offset} does not match layer {layer}'s cache ({held})")

    def check_recurrent_offset(self, layer: int, offset: int) -> None:
        """Check that a recurrent layer's state is past exactly ``offset`` positions."""
        if offset != self.recurrent.get(layer):
            raise InvalidArgumentError(
                f"position {offset} does not match layer {layer}'s state ({self.recurrent.get(layer)})"
            )

    def advance_recurrent(self, layer: int, n: int) -> None:
        """A recurrent layer's state moved on by ``n`` positions."""
        self.recurrent[layer] += n

    def fed(self) -> int | None:
        """The positions every layer has been fed, or None in the middle of a pass."""
        held = {self.recurrent.get(i) for i in self.recurrent}  # recurrent layers have no offset
        held |= {c.offset for i, c in enumerate(self.cache) if i not in self.recurrent}
        return held.pop() if len(held) == 1 else None

    # Operations: each returns the tensors it was asked to send back.

    def _set_tensor(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 1, 0, 1)
        if len(op.data) != 4 * op.args[0] or op.args[0] < 1:
            raise InvalidArgumentError(f"expects {op.args[0]} int32 token ids, got {len(op.data)} bytes")
        ids = np.frombuffer(op.data, dtype="<i4")
        if ids.min() < 0 or ids.max() >= self.model.vocab_size:
            raise InvalidArgumentError(f"token ids must lie in 0..{self.model.vocab_size - 1}")
        self.put(op.outputs[0], mx.array(ids.astype(np.int32))[None])
        return []

    def _get_tensor(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 0, 1, 0)
        x = self.get(op.inputs[0])
        if x.ndim != 3:
            raise InvalidArgumentError(f"expects a [batch, positions, features] tensor, got shape {x.shape}")
        row = np.array(x[0, -1].astype(mx.float32))
        if op.inputs[0] in self._logits and row.size < self.model.vocab_size:
            # An emulation model speaks fewer ids than it reads (specwire.models.tiny): the row a model of
            # this vocabulary ships, every later id at a logit no softmax gives any weight.
            row = np.concatenate([row, np.full(self.model.vocab_size - row.size, UNSPOKEN, np.float32)])
        return [row.tobytes()]

    def _embed(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 1, 2, 0)
        embed = self.module(op.inputs[1], _EMBEDDING, "token embedding")
        self.put(op.outputs[0], embed(self.get(op.inputs[0])))
        return []

    def _rms_norm(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 1, 2, 0)
        norm = self.module(op.inputs[1], (nn.RMSNorm,), "RMSNorm")
        self.put(op.outputs[0], norm(self.get(op.inputs[0])))
        return []

    def _matmul(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 1, 2, 0)
        linear = self.module(op.inputs[1], _LINEAR, "linear layer")
        self.put(op.outputs[0], linear(self.get(op.inputs[0])))
        return []

    def _binary(self, op: pb.Op, fn: Callable[[mx.array, mx.array], mx.array]) -> list[bytes]:
        self.shape(op, 1, 2, 0)
        self.put(op.outputs[0], fn(self.get(op.inputs[0]), self.get(op.inputs[1])))
        return []

    def _silu(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 1, 1, 0)
        self.put(op.outputs[0], nn.silu(self.get(op.inputs[0])))
        return []

    def _lm_head(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 1, 2, 0)
        head = self.module(op.inputs[1], (*_EMBEDDING, *_LINEAR), "LM head")
        x = self.get(op.inputs[0])
        if x.ndim == 3 and x.shape[1] > ROUND_POSITIONS:
            x = x[:, -1:]  # a prefill: GET_TENSOR returns the last position's row, so only it is computed
        self.put(op.outputs[0], head.as_linear(x) if isinstance(head, _EMBEDDING) else head(x))
        self._logits.add(op.outputs[0])
        self.forward_passes += 1
        fed = self.fed()
        if fed is not None and not self.checkpoints.exact:  # a pass ended: keep its recurrent state
            self.checkpoints.keep(fed)
            if len(self.checkpoints.kept) > MAX_KEPT:
                self.checkpoints.forget_before(sorted(self.checkpoints.kept)[-MAX_KEPT])
        return []

    def _kv_trim(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 0, 0, 1)
        n = op.args[0]
        fed = self.fed()
        if fed is None:
            raise InvalidArgumentError("cannot roll back in the middle of a forward pass")
        if not 0 <= n <= fed:
            raise InvalidArgumentError(f"cannot trim {n} positions from a cache of {fed}")
        to = fed - n
        if not self.checkpoints.exact and to and to not in self.checkpoints.kept:
            kept = sorted(self.checkpoints.kept)
            raise InvalidArgumentError(
                f"this model's recurrent layers roll back only to the end of one of its last {MAX_KEPT} "
                f"forward passes; position {to} is not one (kept: {kept[0] if kept else '-'}..{fed})"
            )
        self.checkpoints.rewind(fed, to)
        self.recurrent = dict.fromkeys(self.recurrent, to)
        return []

    def _argmax(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 1, 1, 0)
        logits = self.get(op.inputs[0])
        self.put(op.outputs[0], mx.argmax(logits[:, -1, :], axis=-1)[None])
        return []
