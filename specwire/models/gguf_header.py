"""Reads the tensor table of a GGUF file without loading any tensor data.

MLX's own reader (``mx.load``) does the real loading. This scan runs first so
that an unsupported tensor type is reported by tensor name and type, before
MLX is asked to decode data it cannot handle.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwire.errors import ModelFormatError

GGUF_MAGIC = b"GGUF"

# ggml_type ids, from the GGUF specification.
GGML_TYPE_NAMES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    30: "BF16",
    34: "TQ1_0",
    35: "TQ2_0",
    39: "MXFP4",
}

# Metadata value types: fixed-size scalars by struct format.
_SCALAR_FORMATS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table: name, GGML type name, and shape as GGUF stores it."""

    name: str
    type_name: str
    shape: tuple[int, ...]


class _Reader:
    """A cursor over the file's bytes, memory-mapped: only the header's pages are ever read.

    A vocabulary is 50k-150k strings, so the loop over a string array is the hot path."""

    def __init__(self, data: mmap.mmap, path: Path) -> None:
        self.data = data
        self.size = len(data)
        self.pos = 0
        self.path = path

    def _truncated(self) -> ModelFormatError:
        return ModelFormatError(f"{self.path}: truncated GGUF header")

    def read(self, n: int) -> bytes:
        end = self.pos + n
        if end > self.size:
            raise self._truncated()
        data = self.data[self.pos : end]
        self.pos = end
        return data

    def unpack(self, fmt: str) -> int:
        return int(self._scalar(_struct(fmt)))

    def _scalar(self, layout: struct.Struct) -> Any:
        if self.pos + layout.size > self.size:
            raise self._truncated()
        (value,) = layout.unpack_from(self.data, self.pos)
        self.pos += layout.size
        return value

    def string(self) -> str:
        return self.read(self.unpack("Q")).decode("utf-8", errors="replace")

    def strings(self, count: int, keep: bool = True) -> list[str]:
        """The next ``count`` strings (an array's items); not decoded, and none returned, unless ``keep``."""
        data, pos, size, length = self.data, self.pos, self.size, _struct("Q")
        out = []
        for _ in range(count):
            if pos + 8 > size:
                raise self._truncated()
            (n,) = length.unpack_from(data, pos)
            pos += 8
            if pos + n > size:
                raise self._truncated()
            if keep:
                out.append(data[pos : pos + n].decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out

    def value(self, value_type: int) -> object:
        if value_type in _SCALAR_FORMATS:
            return self._scalar(_struct(_SCALAR_FORMATS[value_type]))
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type, count = self.unpack("I"), self.unpack("Q")
            if item_type in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[item_type]
                return list(struct.unpack(f"<{count}{fmt}", self.read(struct.calcsize(fmt) * count)))
            if item_type == _STRING:
                return self.strings(count)
            return [self.value(item_type) for _ in range(count)]
        raise ModelFormatError(f"{self.path}: unknown GGUF metadata type {value_type}")

    def skip_value(self, value_type: int) -> None:
        if value_type in _SCALAR_FORMATS:
            self.read(struct.calcsize(_SCALAR_FORMATS[value_type]))
        elif value_type == _STRING:
            self.read(self.unpack("Q"))
        elif value_type == _ARRAY:
            item_type, count = self.unpack("I"), self.unpack("Q")
            if item_type in _SCALAR_FORMATS:
                self.read(struct.calcsize(_SCALAR_FORMATS[item_type]) * count)
            elif item_type == _STRING:
                self.strings(count, keep=False)
            else:
                for _ in range(count):
                    self.skip_value(item_type)
        else:
            raise ModelFormatError(f"{self.path}: unknown GGUF metadata type {value_type}")


@functools.cache
def _struct(fmt: str) -> struct.Struct:
    return struct.Struct("<" + fmt)


def is_gguf(path: Path) -> bool:
    """True when the file starts with the GGUF magic bytes."""
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


@contextlib.contextmanager
def _header(path: Path) -> Iterator[tuple[_Reader, int, int]]:
    """The file mapped and its magic and version checked: a reader past them, with the tensor and
    key counts."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < len(GGUF_MAGIC):
            raise ModelFormatError(f"{path}: not a GGUF file (bad magic bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            r = _Reader(data, path)
            if r.read(4) != GGUF_MAGIC:
                raise ModelFormatError(f"{path}: not a GGUF file (bad magic bytes)")
            version = r.unpack("I")
            if version < 2:
                raise ModelFormatError(f"{path}: GGUF version {version} is too old (need 2 or later)")
            yield r, r.unpack("Q"), r.unpack("Q")


def read_metadata(path: Path) -> dict[str, object]:
    """Every metadata key and value of a GGUF file (no tensor data is read)."""
    with _header(path) as (r, _, n_kv):
        metadata = {}
        for _ in range(n_kv):
            key = r.string()
            metadata[key] = r.value(r.unpack("I"))
        return metadata


def read_tensor_table(path: Path) -> list[TensorInfo]:
    """Return the tensor table of a GGUF file (names, types, shapes), skipping all data."""
    with _header(path) as (r, n_tensors, n_kv):
        for _ in range(n_kv):
            r.string()
            r.skip_value(r.unpack("I"))
        table = []
        for _ in range(n_tensors):
            name = r.string()
            shape = tuple(r.unpack("Q") for _ in range(r.unpack("I")))
            type_id = r.unpack("I")
            r.unpack("Q")  # data offset
            table.append(TensorInfo(name, GGML_TYPE_NAMES.get(type_id, f"type {type_id}"), shape))
        return table
