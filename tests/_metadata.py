"""GGUF metadata the way the project's reader (gguflm.gguf) will hand it over, until it lands.

``read_metadata(path)`` gives an ordered dict key -> value: scalars as int/float/bool/str, string
arrays as ``list[str]``, numeric arrays as read-only numpy arrays. It walks the key-value section
with the ``gguf`` package's type codes; the package's own ``GGUFReader`` gives the same values
(tests/test_vocab.py checks) but takes about a minute on a 262k-token vocabulary, which is too slow
for the test suite.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUF_MAGIC, GGUFValueType

_SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_DTYPES = {t: np.dtype(f) for t, f in _SCALARS.items()}


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="surrogateescape")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """All key-value pairs of a GGUF (v2/v3) file."""
    data = memoryview(Path(path).read_bytes())
    magic, version = struct.unpack_from("<II", data, 0)
    if magic != GGUF_MAGIC or version < 2:
        raise ValueError(f"{path}: not a GGUF v2/v3 file")
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    pos = 24

    def string() -> str:
        nonlocal pos
        n = int.from_bytes(data[pos:pos + 8], "little")
        pos += 8 + n
        return _text(bytes(data[pos - n:pos]))

    def value(vtype: int) -> Any:
        nonlocal pos
        if vtype == GGUFValueType.STRING:
            return string()
        if vtype == GGUFValueType.ARRAY:
            etype, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if etype == GGUFValueType.STRING:
                return [string() for _ in range(count)]
            if etype == GGUFValueType.ARRAY:
                return [value(GGUFValueType.ARRAY) for _ in range(count)]
            dtype = _DTYPES[GGUFValueType(etype)]
            arr = np.frombuffer(data, dtype, count, pos).copy()
            pos += count * dtype.itemsize
            arr.setflags(write=False)
            return arr
        fmt = _SCALARS[GGUFValueType(vtype)]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        vtype = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        meta[key] = value(vtype)
    return meta


def write_metadata(path: str | Path, meta: dict[str, Any]) -> None:
    """Write a tensor-less GGUF v3 file holding ``meta`` (for hand-made test vocabularies).

    Python ints are written as UINT32 (token ids), bools as BOOL, str as STRING, lists of str as
    string arrays, numpy arrays with their own element type.
    """
    codes = {np.dtype(f): t for t, f in _SCALARS.items()}

    def string(s: str) -> bytes:
        raw = s.encode("utf-8", errors="surrogateescape")
        return struct.pack("<Q", len(raw)) + raw

    out = [struct.pack("<IIQQ", GGUF_MAGIC, 3, 0, len(meta))]
    for key, value in meta.items():
        out.append(string(key))
        if isinstance(value, bool):
            out.append(struct.pack("<I?", GGUFValueType.BOOL, value))
        elif isinstance(value, int):
            out.append(struct.pack("<II", GGUFValueType.UINT32, value))
        elif isinstance(value, float):
            out.append(struct.pack("<If", GGUFValueType.FLOAT32, value))
        elif isinstance(value, str):
            out.append(struct.pack("<I", GGUFValueType.STRING) + string(value))
        elif isinstance(value, list):
            out.append(struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, len(value)))
            out.extend(string(s) for s in value)
        else:
            arr = np.ascontiguousarray(value)
            out.append(struct.pack("<IIQ", GGUFValueType.ARRAY, codes[arr.dtype.newbyteorder("<")],
                                   len(arr)))
            out.append(arr.astype(arr.dtype.newbyteorder("<")).tobytes())
    Path(path).write_bytes(b"".join(out))
