"""The per-op baseline's executor: one session's cache and the forward pass it is walking.

The pass is the model's own (``worker.per_op.op_walk``): SET_TENSOR (or ARGMAX, for
a chained greedy pass) starts it, each STEP runs the operation it names and
the elementwise work up to the next one, and GET_TENSOR returns the last
position's logits once the pass has ended. Every operation is checked before
it runs: its code, its numbers of inputs and args, and that it is the one
the pass reaches next at the position the session holds. A bad operation
raises ``InvalidArgumentError`` and leaves the worker's other sessions
untouched.

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

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from specwire.drafting.rollback import Checkpoints
from specwire.emulation.pace import ROUND_POSITIONS, Pacer, headroom_bucket
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from worker.per_op.op_walk import PassRun, Walk, hook_cache

MAX_KEPT = 2 * ROUND_POSITIONS  # recurrent states kept: enough to roll back any draft round
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
    walk: Walk
    cache: list = field(default_factory=list)
    graphs: int = 0
    ops: int = 0
    tensor_bytes: int = 0
    forward_passes: int = 0
    pacer: Pacer | None = None
    paced_passes: int = 0
    pace_overruns: int = 0
    pace_buckets: list[int] = field(default_factory=list)  # the paced passes' buckets not yet reported
    position: int = 0  # positions every layer has been fed
    _fed: int = 0  # positions the pass in progress feeds
    ended: str = ""  # the refused operation that ended the session
    _pass: PassRun | None = None
    _logits: mx.array | None = None  # the last ended pass's logits
    _positions: int = 1
    _pass_real_s: float = 0.0
    _pass_paced_s: float = 0.0
    _pass_lag_s: float = 0.0

    def __post_init__(self) -> None:
        self.cache = make_prompt_cache(self.model.model)
        hook_cache(self.cache)
        self.checkpoints = Checkpoints(self.cache)
        self.handles = {handle: name for name, handle in self.walk.names.items()}
        self._ops: dict[int, Callable[[pb.Op], list[bytes]]] = {
            pb.SET_TENSOR: self._set_tensor,
            pb.ARGMAX: self._argmax,
            pb.STEP: self._step,
            pb.GET_TENSOR: self._get_tensor,
            pb.KV_TRIM: self._kv_trim,
        }

    def execute(self, ops: Sequence[pb.Op]) -> Executed:
        """Run ``ops`` in order; return the requested tensors. A refused operation ends the session
        (its cache may hold half a pass), as it ends the stream.

        Paced (``pacer``), the call is then held for its operations' share of
        the paced time of the passes they belong to (a pass's time spread evenly
        over its operations), and each pass that ends here is counted, as an
        overrun if any of its calls overran.
        """
        if self.ended:
            raise InvalidArgumentError(f"the session ended at a refused operation ({self.ended})")
        started_ns, started = time.perf_counter_ns(), time.perf_counter()
        tensors: list[bytes] = []
        paced_s, ended = 0.0, 0
        for index, op in enumerate(ops):
            try:
                tensors.extend(self._run(op))
            except (InvalidArgumentError, ValueError, RuntimeError, IndexError, OverflowError) as err:
                what = pb.OpCode.Name(op.code) if op.code in self._ops else f"unknown op code {op.code}"
                self.ended = f"op {index} ({what}): {err}"
                self.close()
                raise InvalidArgumentError(self.ended) from err
            self.ops += 1
            paced_s += self._share(op)
            ended += op.code == pb.STEP and self._pass is None
        if self.pacer is not None:
            self._pace(started, paced_s, ended)
        self.graphs += 1
        self.tensor_bytes += sum(len(t) for t in tensors)
        return Executed(tensors, started_ns, time.perf_counter_ns())

    def _run(self, op: pb.Op) -> list[bytes]:
        run = self._ops.get(op.code)
        if run is None:
            raise InvalidArgumentError("not an operation of this executor")
        return run(op)

    def close(self) -> None:
        """Drop a pass left half walked (a refused operation, or the session ending)."""
        if self._pass is not None:
            self._pass.abandon()
            self._pass = None

    def _share(self, op: pb.Op) -> float:
        """This operation's part of its pass's paced time (none for the bookkeeping ops)."""
        if op.code == pb.SET_TENSOR:
            self._positions = int(op.args[0])
        elif op.code == pb.ARGMAX:
            self._positions = 1  # a chained pass feeds one token
        if self.pacer is None or op.code == pb.KV_TRIM:
            return 0.0
        return self.pacer.curve.pass_s(self._positions) / self.walk.ops_per_pass

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

    def take_pace_buckets(self) -> list[int]:
        """The headroom buckets of the passes that ended since the last call (each reply reports its own)."""
        taken, self.pace_buckets = self.pace_buckets, []
        return taken

    @staticmethod
    def shape(op: pb.Op, inputs: int, args: int) -> None:
        """Check the operation's numbers of inputs and args (no operation names outputs)."""
        if (len(op.outputs), len(op.inputs), len(op.args)) != (0, inputs, args):
            raise InvalidArgumentError(
                f"takes 0 outputs, {inputs} inputs and {args} args; "
                f"got {len(op.outputs)}, {len(op.inputs)} and {len(op.args)}"
            )

    # Operations: each returns the tensors it was asked to send back.

    def _begin(self, tokens: mx.array, offset: int) -> None:
        """Start a pass over ``tokens`` at ``offset`` (the positions the session holds)."""
        if self._pass is not None:
            raise InvalidArgumentError(f"the pass in progress reaches {self._pass.pending} next")
        if offset != self.position:
            raise InvalidArgumentError(f"position {offset} does not match the session's ({self.position})")
        length = tokens.shape[1]
        last_rows = 1 if length > ROUND_POSITIONS else 0  # a prefill: only the row GET_TENSOR returns
        model, cache = self.model.model, self.cache
        self._pass = PassRun(lambda: model(tokens, cache=cache), last_rows, self.walk.steps[-1])
        self._fed = length

    def _set_tensor(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 0, 2)
        count, offset = op.args
        if len(op.data) != 4 * count or count < 1:
            raise InvalidArgumentError(f"expects {count} int32 token ids, got {len(op.data)} bytes")
        ids = np.frombuffer(op.data, dtype="<i4")
        if ids.min() < 0 or ids.max() >= self.model.vocab_size:
            raise InvalidArgumentError(f"token ids must lie in 0..{self.model.vocab_size - 1}")
        self._begin(mx.array(ids.astype(np.int32))[None], offset)
        return []

    def _argmax(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 0, 1)
        if self._logits is None:
            raise InvalidArgumentError("no pass has ended yet, so there is no token to chain")
        self._begin(mx.argmax(self._logits[:, -1, :], axis=-1)[None], op.args[0])
        return []

    def _step(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 1, 0)
        name = self.handles.get(op.inputs[0])
        if name is None:
            raise InvalidArgumentError(f"handle {op.inputs[0]:#x} names no operation of this model")
        if self._pass is None:
            raise InvalidArgumentError(f"no pass in progress: SET_TENSOR or ARGMAX starts one before {name}")
        if self._pass.step(name):
            self._logits, self._pass = self._pass.logits, None
            self._ended()
        return []

    def _ended(self) -> None:
        """A pass ended: count it, and keep a hybrid model's recurrent state at its end."""
        self.position += self._fed
        self.forward_passes += 1
        if not self.checkpoints.exact:
            self.checkpoints.keep(self.position)
            if len(self.checkpoints.kept) > MAX_KEPT:
                self.checkpoints.forget_before(sorted(self.checkpoints.kept)[-MAX_KEPT])

    def _get_tensor(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 0, 0)
        if self._pass is not None:
            raise InvalidArgumentError(f"the pass has not ended: it reaches {self._pass.pending} next")
        if self._logits is None:
            raise InvalidArgumentError("no pass has ended yet")
        row = np.array(self._logits[0, -1].astype(mx.float32))
        if row.size < self.model.vocab_size:
            # An emulation model speaks fewer ids than it reads (specwire.models.tiny): the row a model of
            # this vocabulary ships, every later id at a logit no softmax gives any weight.
            row = np.concatenate([row, np.full(self.model.vocab_size - row.size, UNSPOKEN, np.float32)])
        return [row.tobytes()]

    def _kv_trim(self, op: pb.Op) -> list[bytes]:
        self.shape(op, 0, 1)
        n = op.args[0]
        if self._pass is not None:
            raise InvalidArgumentError("cannot roll back in the middle of a forward pass")
        if not 0 <= n <= self.position:
            raise InvalidArgumentError(f"cannot trim {n} positions from a cache of {self.position}")
        to = self.position - n
        if not self.checkpoints.exact and to and to not in self.checkpoints.kept:
            kept = sorted(self.checkpoints.kept)
            span = f"{kept[0] if kept else '-'}..{self.position}"
            raise InvalidArgumentError(
                f"this model's recurrent layers roll back only to the end of one of its last {MAX_KEPT} "
                f"forward passes; position {to} is not one (kept: {span})"
            )
        self.checkpoints.rewind(self.position, to)
        self.position = to
        return []
