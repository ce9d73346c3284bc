"""GGUF metadata as the project's reader will hand it over, built with the ``gguf`` package.

``read_metadata(path)`` gives an ordered dict key -> value: scalars as int/float/bool/str, string
arrays as ``list[str]``, numeric arrays as read-only numpy arrays. (Until gguflm.gguf lands.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType


def _text(raw) -> str:
    return bytes(raw).decode("utf-8", errors="surrogateescape")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """All key-value pairs of a GGUF file."""
    reader = GGUFReader(str(path))
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            etype = field.types[1] if len(field.types) > 1 else None
            if etype == GGUFValueType.STRING:
                meta[key] = [_text(field.parts[i]) for i in field.data]
            else:
                values = np.concatenate([field.parts[i] for i in field.data]) if field.data else \
                    np.zeros(0, dtype=np.int32)
                values = np.array(values)
                values.setflags(write=False)
                meta[key] = values
        elif vtype == GGUFValueType.STRING:
            meta[key] = _text(field.parts[field.data[0]])
        elif vtype == GGUFValueType.BOOL:
            meta[key] = bool(field.parts[field.data[0]][0])
        elif vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
            meta[key] = float(field.parts[field.data[0]][0])
        else:
            meta[key] = int(field.parts[field.data[0]][0])
    return meta
