"""What the GGUF format fixes: magic, versions, value types, well-known keys, split file names.

Values follow ggml's ``gguf.h``/``gguf.cpp`` and gguf-py; limits follow the checks llama.cpp makes
when it opens a file (``gguf_init_from_file``).
"""

from __future__ import annotations

import re
import struct
from enum import IntEnum
from pathlib import Path

import numpy as np

from gguflm.ggml_types import GGMLType

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3  # what the writer produces
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 63  # GGML_MAX_NAME is 64 including the terminating NUL
MAX_ARRAY_DEPTH = 16  # llama.cpp refuses nested arrays; gguf-py writes them; we bound the recursion
INT64_MAX = 2**63 - 1

KEY_ARCHITECTURE = "general.architecture"
KEY_ALIGNMENT = "general.alignment"
KEY_FILE_TYPE = "general.file_type"
KEY_SPLIT_NO = "split.no"
KEY_SPLIT_COUNT = "split.count"
KEY_SPLIT_TENSORS_COUNT = "split.tensors.count"

# fixed-size little-endian fields of the container
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, metadata count


class GGUFValueType(IntEnum):
    """Type tag of a metadata value (``enum gguf_type``)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12

    @property
    def dtype(self) -> np.dtype | None:
        """Little-endian numpy dtype of a scalar of this type; None for STRING and ARRAY."""
        return _SCALAR_DTYPES.get(self)

    @property
    def struct_format(self) -> str | None:
        """:mod:`struct` format of a scalar of this type; None for STRING and ARRAY."""
        return _STRUCT_FORMATS.get(self)

    @property
    def is_integer(self) -> bool:
        return self in _INTEGER_RANGES

    @property
    def is_float(self) -> bool:
        return self in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)

    @property
    def integer_range(self) -> tuple[int, int]:
        """Smallest and largest value of an integer type."""
        return _INTEGER_RANGES[self]

    @property
    def min_encoded_size(self) -> int:
        """Fewest bytes one value of this type occupies in a file (bounds counts before reading)."""
        if self is GGUFValueType.STRING:
            return U64.size  # the length of an empty string
        if self is GGUFValueType.ARRAY:
            return U32.size + U64.size  # element type and count of an empty array
        return _SCALAR_DTYPES[self].itemsize


_SCALAR_DTYPES: dict[GGUFValueType, np.dtype] = {
    GGUFValueType.UINT8: np.dtype("u1"),
    GGUFValueType.INT8: np.dtype("i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("?"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}

# explicit: numpy's type characters ('l', 'L') mean 4 bytes to struct's standard sizes
_STRUCT_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}

_INTEGER_RANGES: dict[GGUFValueType, tuple[int, int]] = {
    t: (int(np.iinfo(_SCALAR_DTYPES[t]).min), int(np.iinfo(_SCALAR_DTYPES[t]).max))
    for t in _SCALAR_DTYPES
    if _SCALAR_DTYPES[t].kind in "iu"
}

_VALUE_TYPE_OF_DTYPE: dict[np.dtype, GGUFValueType] = {
    dt.newbyteorder("="): t for t, dt in _SCALAR_DTYPES.items()
}


def value_type_of_dtype(dtype: np.dtype) -> GGUFValueType:
    """The value type whose elements a numpy array of ``dtype`` holds (TypeError if none)."""
    try:
        return _VALUE_TYPE_OF_DTYPE[np.dtype(dtype).newbyteorder("=")]
    except KeyError:
        raise TypeError(f"no GGUF value type for numpy dtype {dtype}") from None

# numpy dtype of one element of the ggml types stored one element per block (BF16 as raw uint16)
TENSOR_DTYPES: dict[GGMLType, np.dtype] = {
    GGMLType.F32: np.dtype("<f4"),
    GGMLType.F16: np.dtype("<f2"),
    GGMLType.BF16: np.dtype("<u2"),
    GGMLType.F64: np.dtype("<f8"),
    GGMLType.I8: np.dtype("i1"),
    GGMLType.I16: np.dtype("<i2"),
    GGMLType.I32: np.dtype("<i4"),
    GGMLType.I64: np.dtype("<i8"),
}

# a tensor type inferred from a numpy array's dtype (gguf-py's choices; BF16 must be asked for)
TENSOR_TYPE_OF_DTYPE: dict[np.dtype, GGMLType] = {
    dt.newbyteorder("="): t for t, dt in TENSOR_DTYPES.items() if t is not GGMLType.BF16
}

_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_path(prefix: Path, index: int, count: int) -> Path:
    """Path of part ``index`` (0-based) of ``count``, e.g. ``model-00002-of-00003.gguf``."""
    return prefix.with_name(f"{prefix.name}-{index + 1:05d}-of-{count:05d}.gguf")


def split_prefix(path: Path) -> Path | None:
    """``x`` for ``x-00001-of-00003.gguf``; None when the name does not follow the split pattern."""
    match = _SPLIT_NAME.match(path.name)
    return path.with_name(match["prefix"]) if match else None


def align_up(offset: int, alignment: int) -> int:
    """``offset`` rounded up to a multiple of ``alignment``."""
    return -(-offset // alignment) * alignment
