"""What a request does to the logits before they are sampled, beyond temperature and truncation.

* ``logit_bias``: added to the named tokens' logits;
* ``repetition_penalty``, ``presence_penalty`` and ``frequency_penalty``, as
  mlx-lm (and so ``mlx_lm.server``) defines them: over the last
  ``PENALTY_CONTEXT`` tokens of prompt and output, a repeated token's logit
  is divided by the repetition penalty (multiplied when negative), lowered
  by the presence penalty once, and by the frequency penalty once per time
  it occurs;
* a ``Constraint`` (a grammar: ``specwire.logits.grammar``) that masks
  every token the grammar does not allow next.

Each is a function of the history a position follows. That keeps
speculative decoding exact under them: the verifier processes each position
of a pass with the history it would have if the drafts before it were
accepted (a chain's earlier drafts, or a tree node's path), so the target's
distribution at every position is exactly the one the target alone would
sample from there, and the acceptance rules need nothing else.
``ProcessedRows`` does that lazily, a row when the acceptance walk first
reads it: rows past a rejected draft are never processed.

Rows are NumPy float64, one vocabulary each; a masked token's logit is -inf.
Draft trees rank their nodes where the logits are instead (``penalised`` and
``masks``): only the ids a bias or penalty names, at most a few dozen a row,
are read and written there, not the whole vocabulary.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx
import numpy as np

from specwire.errors import UnsupportedModelError

PENALTY_CONTEXT = 20  # tokens the penalties look back over (mlx-lm's default context size)


class Constraint(Protocol):
    """A grammar over the output: which tokens may come next after the accepted output and a suffix."""

    def allowed(self, suffix: Sequence[int]) -> np.ndarray | None:
        """Bool mask over the vocabulary after the accepted output and ``suffix``; None when ``suffix``
        itself breaks the grammar (that position is never reached)."""
        ...

    def accept(self, tokens: Sequence[int]) -> None:
        """Extend the accepted output by ``tokens`` (each allowed where it came)."""
        ...


@dataclass(frozen=True)
class Penalties:
    """A request's logit bias and repetition penalties (all off by default)."""

    logit_bias: tuple[tuple[int, float], ...] = ()
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def active(self) -> bool:
        """Whether any of them changes a logit."""
        return (
            bool(self.logit_bias)
            or self.repetition_penalty != 1.0
            or bool(self.presence_penalty or self.frequency_penalty)
        )


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability under the target's processed logits (at temperature 1, before
    truncation, as mlx_lm.server gives it), and the ``top`` most probable tokens' (id, logprob)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class Processing:
    """One generation's logits processing: its penalties and constraint, and the history they read.

    With ``logprobs`` (the top alternatives to report, 0 for none), each emitted token's log-probability
    is kept in ``logprobs_out`` as it is verified.
    """

    def __init__(
        self,
        penalties: Penalties,
        history: Sequence[int],
        constraint: Constraint | None = None,
        logprobs: int | None = None,
    ) -> None:
        self.penalties = penalties
        self.constraint = constraint
        self.logprobs = logprobs
        self.logprobs_out: list[TokenLogprob] = []
        self.ns = 0  # time spent processing rows (drafts' and verdicts'), and how many
        self.rows = 0
        self.output = 0  # tokens accepted after ``history`` (a session opened later starts the grammar there)
        self._recent = list(history[-PENALTY_CONTEXT:])
        self._bias: dict[int, float] = {}
        for token, value in penalties.logit_bias:
            self._bias[token] = self._bias.get(token, 0.0) + value
        self._penalise = penalties.repetition_penalty != 1.0 or bool(
            penalties.presence_penalty or penalties.frequency_penalty
        )

    def row(self, logits: np.ndarray, suffix: Sequence[int]) -> np.ndarray:
        """``logits`` (one vocabulary, any float type) processed as after the history and ``suffix``."""
        started = time.perf_counter_ns()
        try:
            return self._row(logits, suffix)
        finally:
            self.ns += time.perf_counter_ns() - started
            self.rows += 1

    def _row(self, logits: np.ndarray, suffix: Sequence[int]) -> np.ndarray:
        out = np.array(logits, dtype=np.float64)
        ids, bias, counts = self._moves(suffix, out.size)
        if ids:
            at = np.array(ids)
            out[at] = self._moved(out[at] + np.array(bias), np.array(counts, dtype=np.float64), np.where)
        if self.constraint is not None:
            allowed = self.constraint.allowed(suffix)
            if allowed is None:  # unreachable: a draft before this position breaks the grammar
                allowed = np.zeros(out.size, dtype=bool)
            out[: allowed.size][~allowed[: out.size]] = -np.inf
            out[allowed.size :] = -np.inf
            if allowed.any() and not np.isfinite(out).any():
                raise UnsupportedModelError(
                    "the grammar allows only tokens this model never emits (its output covers "
                    f"{out.size} of {allowed.size} ids)"
                )
        return out

    def penalised(self, rows: mx.array, suffixes: Sequence[Sequence[int]]) -> mx.array:
        """``rows`` (logits where the model ran, a row after each of ``suffixes``) in float32 with the bias
        and penalties applied as ``row`` applies them (lazily, on the device: only the ids they name
        are gathered and scattered); the rows as given when neither acts. The grammar is ``masks``'."""
        if not self.penalties.active:
            return rows
        started = time.perf_counter_ns()
        batch, vocab = rows.shape
        at: list[int] = []
        added: list[float] = []
        times: list[int] = []
        for i, suffix in enumerate(suffixes):
            ids, bias, counts = self._moves(suffix, vocab)
            at += [i * vocab + t for t in ids]
            added += bias
            times += counts
        flat = rows.astype(mx.float32).reshape(-1)
        if at:
            index = mx.array(at)
            value = flat[index] + mx.array(added, dtype=mx.float32)
            flat[index] = self._moved(value, mx.array(times, dtype=mx.float32), mx.where)
        if self.constraint is None:
            self.rows += batch
        self.ns += time.perf_counter_ns() - started
        return flat.reshape(batch, vocab)

    def _moves(self, suffix: Sequence[int], vocab: int) -> tuple[list[int], list[float], list[int]]:
        """The ids (below ``vocab``) the bias and penalties move after ``suffix``: each with its bias,
        and how often it occurs in the penalties' window (0: not there)."""
        window = Counter([*self._recent, *suffix][-PENALTY_CONTEXT:]) if self._penalise else Counter()
        ids = [t for t in sorted(self._bias.keys() | window.keys()) if 0 <= t < vocab]
        return ids, [self._bias.get(t, 0.0) for t in ids], [window[t] for t in ids]

    def _moved(self, value: Any, count: Any, where: Callable[..., Any]) -> Any:
        """``value`` (the moved ids' logits, bias added; NumPy or MLX, with its ``where``) with the
        penalties applied where ``count`` > 0, as mlx-lm applies them."""
        p = self.penalties
        repeated = where(value < 0, value * p.repetition_penalty, value / p.repetition_penalty)
        repeated = repeated - p.presence_penalty - p.frequency_penalty * count
        return where(count > 0, repeated, value)

    def masks(self, suffixes: Sequence[Sequence[int]], vocab: int) -> np.ndarray | None:
        """With a grammar, the bool masks over ``vocab`` logits that it amounts to after each of
        ``suffixes`` (a row of False where a suffix breaks the grammar), to apply where the logits are
        (after ``penalised``); None without one."""
        if self.constraint is None:
            return None
        started = time.perf_counter_ns()
        out = np.zeros((len(suffixes), vocab), dtype=bool)
        for i, suffix in enumerate(suffixes):
            allowed = self.constraint.allowed(suffix)
            if allowed is not None:
                out[i, : allowed.size] = allowed[:vocab]
        self.ns += time.perf_counter_ns() - started
        self.rows += len(suffixes)
        return out

    def record(self, rows: Sequence[np.ndarray], emitted: Sequence[int]) -> None:
        """Keep the log-probabilities of ``emitted``, each under its processed row (with ``logprobs``)."""
        if self.logprobs is None:
            return
        for row, token in zip(rows, emitted, strict=True):
            finite = row[np.isfinite(row)]
            logz = float(finite.max() + np.log(np.exp(finite - finite.max()).sum()))
            top: tuple[tuple[int, float], ...] = ()
            if self.logprobs:
                best = np.argpartition(-row, self.logprobs - 1)[: self.logprobs]
                best = best[np.lexsort((best, -row[best]))]
                top = tuple((int(t), float(row[t]) - logz) for t in best)
            self.logprobs_out.append(TokenLogprob(int(token), float(row[token]) - logz, top))

    def accept(self, tokens: Sequence[int]) -> None:
        """The output grew by ``tokens``."""
        self._recent = [*self._recent, *tokens][-PENALTY_CONTEXT:]
        self.output += len(tokens)
        if self.constraint is not None:
            self.constraint.accept(tokens)


class ProcessedRows(Sequence[np.ndarray]):
    """A verification pass's logits rows, each processed on first read with the suffix it follows."""

    def __init__(
        self, logits: np.ndarray, processing: Processing, suffix_of: Callable[[int], Sequence[int]]
    ) -> None:
        self._logits = logits
        self._processing = processing
        self._suffix_of = suffix_of
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._logits)

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]  # rows are read one at a time
        i = i % len(self._logits)
        row = self._rows.get(i)
        if row is None:
            row = self._rows[i] = self._processing.row(self._logits[i], self._suffix_of(i))
        return row


class Choices(Sequence[int]):
    """The argmax of each processed row, on first read (greedy verdicts)."""

    def __init__(self, rows: ProcessedRows) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> int:  # type: ignore[override]  # read one at a time
        return int(np.argmax(self._rows[i]))


def chain_suffix(drafts: Sequence[int]) -> Callable[[int], Sequence[int]]:
    """Row i of a chain's pass follows the first i drafts."""
    return lambda i: drafts[:i]


def tree_suffix(tokens: Sequence[int], path: Callable[[int], list[int]]) -> Callable[[int], Sequence[int]]:
    """Row 0 of a tree's pass follows the verified prefix; row i + 1 follows node i's path."""
    return lambda i: [tokens[n] for n in path(i - 1)] if i else ()
