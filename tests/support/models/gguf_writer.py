"""A small GGUF writer for tests: F32, F16, Q4_0, Q4_1 and Q8_0 tensors, or any declared type.

It writes files the way llama.cpp's converter lays them out (GGUF v3, tensor
data aligned to 32 bytes, dimensions innermost first), so the loader under
test meets the real format rather than MLX's own writer.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12}
ALIGNMENT = 32
BLOCK = 32


def _string(s: str) -> bytes:
    data = s.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _value(v: Any) -> bytes:
    if isinstance(v, bool):
        return struct.pack("<I?", 7, v)
    if isinstance(v, int):
        return struct.pack("<Ii", 5, v) if v < 2**31 else struct.pack("<IQ", 10, v)
    if isinstance(v, float):
        return struct.pack("<If", 6, v)
    if isinstance(v, str):
        return struct.pack("<I", 8) + _string(v)
    if isinstance(v, list) and v and isinstance(v[0], str):
        return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(_string(s) for s in v)
    arr = np.asarray(v)
    kind = {np.dtype(np.int32): 5, np.dtype(np.float32): 6, np.dtype(np.uint32): 4}[arr.dtype]
    return struct.pack("<IIQ", 9, kind, arr.size) + arr.tobytes()


def quantize_q8_0(w: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Q8_0 blocks of 32 and the values they decode to."""
    blocks = w.reshape(-1, BLOCK).astype(np.float32)
    d = (np.abs(blocks).max(axis=1) / 127.0).astype(np.float16)
    inv = np.where(d == 0, 0, 1.0 / d.astype(np.float32))
    q = np.clip(np.round(blocks * inv[:, None]), -127, 127).astype(np.int8)
    raw = b"".join(d[i].tobytes() + q[i].tobytes() for i in range(len(q)))
    return raw, (q.astype(np.float32) * d.astype(np.float32)[:, None]).reshape(w.shape)


def _pack_nibbles(q: np.ndarray) -> bytes:
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8).tobytes()


def quantize_q4_0(w: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Q4_0 blocks (scale, 4-bit values offset by 8) and the values they decode to."""
    blocks = w.reshape(-1, BLOCK).astype(np.float32)
    idx = np.abs(blocks).argmax(axis=1)
    extreme = blocks[np.arange(len(blocks)), idx]
    d = (extreme / -8.0).astype(np.float16)
    inv = np.where(d == 0, 0, 1.0 / d.astype(np.float32))
    q = np.clip(np.round(blocks * inv[:, None] + 8), 0, 15).astype(np.uint8)
    packed = _pack_nibbles(q)
    raw = b"".join(d[i].tobytes() + packed[16 * i : 16 * i + 16] for i in range(len(q)))
    return raw, ((q.astype(np.float32) - 8) * d.astype(np.float32)[:, None]).reshape(w.shape)


def quantize_q4_1(w: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Q4_1 blocks (scale, minimum, 4-bit values) and the values they decode to."""
    blocks = w.reshape(-1, BLOCK).astype(np.float32)
    lo, hi = blocks.min(axis=1), blocks.max(axis=1)
    d = ((hi - lo) / 15.0).astype(np.float16)
    m = lo.astype(np.float16)
    inv = np.where(d == 0, 0, 1.0 / d.astype(np.float32))
    q = np.clip(np.round((blocks - m.astype(np.float32)[:, None]) * inv[:, None]), 0, 15).astype(np.uint8)
    packed = _pack_nibbles(q)
    raw = b"".join(d[i].tobytes() + m[i].tobytes() + packed[16 * i : 16 * i + 16] for i in range(len(q)))
    decoded = q.astype(np.float32) * d.astype(np.float32)[:, None] + m.astype(np.float32)[:, None]
    return raw, decoded.reshape(w.shape)


def encode_tensor(w: np.ndarray, type_name: str) -> tuple[bytes, np.ndarray]:
    """Bytes of ``w`` stored as ``type_name``, and the float values a reader will decode."""
    if type_name == "F32":
        return w.astype(np.float32).tobytes(), w.astype(np.float32)
    if type_name == "F16":
        return w.astype(np.float16).tobytes(), w.astype(np.float16).astype(np.float32)
    return {"Q8_0": quantize_q8_0, "Q4_0": quantize_q4_0, "Q4_1": quantize_q4_1}[type_name](w)


def write_gguf(
    path: Path, metadata: dict[str, Any], tensors: dict[str, tuple[bytes, tuple[int, ...], str]]
) -> None:
    """Write a GGUF v3 file. ``tensors`` maps name -> (data, numpy shape, type name)."""
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    header += b"".join(_string(k) + _value(v) for k, v in metadata.items())
    infos, blobs, offset = b"", [], 0
    for name, (data, shape, type_name) in tensors.items():
        dims = tuple(reversed(shape))
        infos += _string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", TYPE_IDS[type_name], offset)
        pad = (-len(data)) % ALIGNMENT
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    head = header + infos
    head += b"\0" * ((-len(head)) % ALIGNMENT)
    path.write_bytes(head + b"".join(blobs))
