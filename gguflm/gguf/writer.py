"""Write GGUF v3 files: typed metadata, tensors of any ggml type, alignment, split output.

The layout is the one llama.cpp and gguf-py write: header, metadata, tensor infos, padding to the
alignment, then each tensor's bytes padded to the alignment. Values are encoded when added, so a
value that cannot be written fails at :meth:`GGUFWriter.add` rather than half-way through a file.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from gguflm.ggml_types import GGMLType
from gguflm.gguf.constants import (
    DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_VERSION,
    HEADER,
    KEY_ALIGNMENT,
    KEY_ARCHITECTURE,
    KEY_SPLIT_COUNT,
    KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS_COUNT,
    MAX_DIMS,
    MAX_NAME_BYTES,
    TENSOR_DTYPES,
    TENSOR_TYPE_OF_DTYPE,
    U32,
    U64,
    GGUFValueType,
    align_up,
    split_path,
    value_type_of_dtype,
)

_T = GGUFValueType
_MAX_SPLIT_PARTS = 65535  # split.count is a UINT16


@dataclass(frozen=True, slots=True)
class _PendingTensor:
    name: str
    type: GGMLType
    shape: tuple[int, ...]  # ggml order
    nbytes: int
    data: np.ndarray | Callable[[], np.ndarray]  # little-endian bytes, or made when written


def _tensor_bytes(t: _PendingTensor) -> np.ndarray:
    """The tensor's bytes as flat uint8, producing them now for a lazily added tensor."""
    data = t.data() if callable(t.data) else t.data
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if raw.nbytes != t.nbytes:
        raise ValueError(f"tensor {t.name!r}: {t.type.name} of shape {t.shape} needs {t.nbytes} "
                         f"bytes, its data gave {raw.nbytes}")
    return raw


def _encode_str(text: str | bytes | bytearray) -> bytes:
    raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
    return U64.pack(len(raw)) + raw


def _entry(key: str, vtype: GGUFValueType, encoded_value: bytes) -> bytes:
    return _encode_str(key) + U32.pack(vtype) + encoded_value


def _infer_scalar_type(value: Any) -> GGUFValueType:
    """As gguf-py: bool → BOOL, int → INT32 (wider if it does not fit), float → FLOAT32."""
    if isinstance(value, (bool, np.bool_)):
        return _T.BOOL
    if isinstance(value, (str, bytes, bytearray)):
        return _T.STRING
    if isinstance(value, (np.integer, np.floating)):
        return value_type_of_dtype(value.dtype)
    if isinstance(value, numbers.Integral):
        return _smallest_int_type([int(value)])
    if isinstance(value, numbers.Real):
        return _T.FLOAT32
    if isinstance(value, (list, tuple, np.ndarray)):
        return _T.ARRAY
    raise TypeError(f"no GGUF value type for {type(value).__name__} {value!r}")


def _smallest_int_type(values: Sequence[int]) -> GGUFValueType:
    lo, hi = min(values, default=0), max(values, default=0)
    for vtype in (_T.INT32, _T.INT64, _T.UINT64):
        tmin, tmax = vtype.integer_range
        if tmin <= lo and hi <= tmax:
            return vtype
    raise ValueError(f"integer {lo if lo < 0 else hi} does not fit any GGUF integer type")


def _infer_element_type(items: Any) -> GGUFValueType:
    if isinstance(items, np.ndarray):
        return value_type_of_dtype(items.dtype)
    if not len(items):
        return _T.STRING  # an empty list reads back as [] either way
    kinds = {_infer_scalar_type(item) for item in items}
    if len(kinds) == 1:
        return kinds.pop()
    python_numbers = not any(isinstance(item, np.generic) for item in items)
    if python_numbers and all(k.is_integer for k in kinds):
        return _smallest_int_type(items)
    if python_numbers and all(k.is_integer or k is _T.FLOAT32 for k in kinds):
        return _T.FLOAT32  # ints among floats
    raise TypeError(f"array items of mixed types: {sorted(k.name for k in kinds)}")


def _encode_scalar(value: Any, vtype: GGUFValueType) -> bytes:
    if vtype is _T.STRING:
        if not isinstance(value, (str, bytes, bytearray)):
            raise TypeError(f"STRING value must be str or bytes, got {type(value).__name__}")
        return _encode_str(value)
    return _encode_numbers([value], vtype)


def _encode_numbers(values: Any, vtype: GGUFValueType) -> bytes:
    """Little-endian bytes of numbers (a list or a numpy array) as ``vtype``, range-checked."""
    arr = np.asarray(values) if isinstance(values, np.ndarray) else np.asarray(values, dtype=object)
    if arr.ndim != 1:
        raise ValueError(f"a GGUF array is one-dimensional, got shape {arr.shape}")
    if vtype is _T.BOOL:
        if arr.dtype != np.bool_ and not all(isinstance(v, (bool, np.bool_)) for v in arr):
            raise TypeError("BOOL values must be bools")
        return arr.astype(np.uint8).tobytes()
    if vtype.is_integer:
        if arr.dtype.kind not in "iu":
            if not all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))
                       for v in arr):
                raise TypeError(f"{vtype.name} values must be integers")
        tmin, tmax = vtype.integer_range
        if arr.size and not (tmin <= int(arr.min()) and int(arr.max()) <= tmax):
            raise ValueError(f"values {int(arr.min())}..{int(arr.max())} out of {vtype.name} range "
                             f"{tmin}..{tmax}")
    elif arr.dtype.kind not in "iuf" and not all(
            isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in arr):
        raise TypeError(f"{vtype.name} values must be numbers")
    try:
        with np.errstate(over="ignore"):  # reported below
            out = arr.astype(vtype.dtype)
        overflow = vtype.is_float and np.isinf(out).any() and np.isfinite(arr.astype(float)).all()
    except OverflowError:  # a Python int beyond any float
        overflow = True
    if overflow:
        raise ValueError(f"value too large for {vtype.name}")
    return out.tobytes()


def _encode_array(items: Any, etype: GGUFValueType | None) -> bytes:
    """Element type, count and elements of an array value."""
    if isinstance(items, (str, bytes, bytearray)) or not isinstance(items, (Sequence, np.ndarray)):
        raise TypeError(f"an ARRAY value must be a list, tuple or numpy array, got "
                        f"{type(items).__name__}")
    etype = _infer_element_type(items) if etype is None else _T(etype)
    head = U32.pack(etype) + U64.pack(len(items))
    if etype is _T.STRING:
        return head + b"".join(_encode_scalar(item, _T.STRING) for item in items)
    if etype is _T.ARRAY:
        return head + b"".join(_encode_array(item, None) for item in items)
    return head + _encode_numbers(items, etype)


class GGUFWriter:
    """Collect metadata and tensors, then :meth:`write` a GGUF v3 file (or its split parts).

    Parameters
    ----------
    path
        Output file. Split output goes next to it as ``{stem}-0000i-of-0000n.gguf``.
    arch
        When given, ``general.architecture`` is added first, as gguf-py does.
    alignment
        Data alignment; a value other than 32 is also stored as ``general.alignment`` (UINT32).

    Notes
    -----
    Adding a key again replaces its value in place. Tensor arrays are kept by reference until
    :meth:`write`; do not change them in between.
    """

    def __init__(self, path: str | PathLike[str], *, arch: str | None = None,
                 alignment: int = DEFAULT_ALIGNMENT) -> None:
        self.path = Path(path)
        self.alignment = DEFAULT_ALIGNMENT
        self._kv: dict[str, bytes] = {}  # key -> the entry as written: key, type tag, value
        self._tensors: dict[str, _PendingTensor] = {}
        if arch is not None:
            self.add(KEY_ARCHITECTURE, arch)
        if alignment != DEFAULT_ALIGNMENT:
            self.add(KEY_ALIGNMENT, alignment)

    # -- metadata

    def add(self, key: str, value: Any, value_type: GGUFValueType | None = None,
            array_type: GGUFValueType | None = None) -> None:
        """Add a metadata entry.

        Parameters
        ----------
        key
            Non-empty key; ``general.alignment`` also sets the data alignment.
        value
            ``bool``, ``int``, ``float``, ``str``/``bytes``, a list/tuple, a 1-D numpy array, or a
            list of such arrays (a nested array).
        value_type
            Overrides the inferred type: bool → BOOL, int → INT32 (INT64/UINT64 when it does not
            fit), float → FLOAT32, str → STRING, numpy scalars and arrays by dtype.
        array_type
            Element type of an array (inferred like a scalar's type when omitted).
        """
        if not isinstance(key, str) or not key:
            raise ValueError(f"a metadata key must be a non-empty str, got {key!r}")
        if key == KEY_ALIGNMENT and value_type is None:
            value_type = _T.UINT32
        vtype = _infer_scalar_type(value) if value_type is None else _T(value_type)
        if array_type is not None and vtype is not _T.ARRAY:
            raise ValueError(f"array_type given for {key!r}, whose type is {vtype.name}")
        if key == KEY_ALIGNMENT:
            self._set_alignment(value, vtype)
        try:
            if vtype is _T.ARRAY:
                encoded = _encode_array(value, array_type)
            else:
                encoded = _encode_scalar(value, vtype)
            self._kv[key] = _entry(key, vtype, encoded)
        except (TypeError, ValueError) as exc:  # incl. UnicodeEncodeError for lone surrogates
            error = TypeError if isinstance(exc, TypeError) else ValueError
            raise error(f"metadata {key!r}: {exc}") from None

    def _set_alignment(self, value: Any, vtype: GGUFValueType) -> None:
        if vtype is not _T.UINT32:
            raise ValueError(f"{KEY_ALIGNMENT} must be UINT32, got {vtype.name}")
        if not isinstance(value, numbers.Integral) or value <= 0 or value & (value - 1):
            raise ValueError(f"{KEY_ALIGNMENT} must be a power of two, got {value!r}")
        self.alignment = int(value)

    # -- tensors

    def add_tensor(self, name: str, data: np.ndarray | Callable[[], np.ndarray],
                   type: GGMLType | None = None, shape: Sequence[int] | None = None) -> None:
        """Add a tensor.

        Parameters
        ----------
        name
            Unique, at most 63 UTF-8 bytes (ggml's limit).
        data
            For F32/F16/F64/I8/I16/I32/I64 an array of that dtype (BF16: uint16 bits); for block
            types the raw blocks as uint8, e.g. of shape ``(*rows, row_bytes)``. Raw uint8 bytes
            are accepted for any type when ``shape`` is given. A callable (with ``type`` and
            ``shape`` given) is called when :meth:`write` reaches the tensor and returns its
            bytes: a file larger than memory is written one tensor at a time.
        type
            The ggml type; inferred from the dtype for the plain types.
        shape
            ggml-order shape (``ne[0]``, the row length, first), 1 to 4 dimensions as ggml writes
            them. Default: the reversed numpy shape, or for uint8 blocks
            ``(row elements, *reversed(data.shape[:-1]))``.
        """
        if callable(data):
            self._add_lazy_tensor(name, data, type, shape)
            return
        data = np.asarray(data)
        if type is None:
            type = TENSOR_TYPE_OF_DTYPE.get(data.dtype.newbyteorder("="))
            if type is None:
                raise TypeError(f"tensor {name!r}: cannot infer a ggml type from dtype "
                                f"{data.dtype}; pass type=")
        ggml_type = GGMLType(type)
        self._check_tensor_name(name)
        raw_bytes = data.dtype == np.uint8
        if not raw_bytes:
            dtype = TENSOR_DTYPES.get(ggml_type)
            if dtype is None:
                raise TypeError(f"tensor {name!r}: {ggml_type.name} data must be raw uint8 "
                                f"blocks, got {data.dtype}")
            if data.dtype.newbyteorder("<") != dtype:
                raise TypeError(f"tensor {name!r}: {ggml_type.name} data must be {dtype}, "
                                f"got {data.dtype}")
            data = data.astype(dtype, copy=False)  # little-endian
        if shape is None:
            shape = self._default_shape(name, data, ggml_type, raw_bytes)
        shape = self._checked_shape(name, shape, ggml_type)
        n_elements = int(np.prod(shape, dtype=object))
        nbytes = n_elements // ggml_type.block_size * ggml_type.type_size
        if raw_bytes and data.nbytes != nbytes:
            raise ValueError(f"tensor {name!r}: {ggml_type.name} of shape {shape} needs "
                             f"{nbytes} bytes, got {data.nbytes}")
        if not raw_bytes and data.size != n_elements:
            raise ValueError(f"tensor {name!r}: shape {shape} has {n_elements} elements, "
                             f"data has {data.size}")
        self._tensors[name] = _PendingTensor(name, ggml_type, shape, nbytes, data)

    def _add_lazy_tensor(self, name: str, produce: Callable[[], np.ndarray],
                         type: GGMLType | None, shape: Sequence[int] | None) -> None:
        if type is None or shape is None:
            raise TypeError(f"tensor {name!r}: data made at write time needs type= and shape=")
        ggml_type = GGMLType(type)
        self._check_tensor_name(name)
        shape = self._checked_shape(name, shape, ggml_type)
        nbytes = int(np.prod(shape, dtype=object)) // ggml_type.block_size * ggml_type.type_size
        self._tensors[name] = _PendingTensor(name, ggml_type, shape, nbytes, produce)

    @staticmethod
    def _checked_shape(name: str, shape: Sequence[int], ggml_type: GGMLType) -> tuple[int, ...]:
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= MAX_DIMS or any(d < 1 for d in shape):
            raise ValueError(f"tensor {name!r}: shape {shape} needs 1..{MAX_DIMS} dimensions >= 1")
        if shape[0] % ggml_type.block_size:
            raise ValueError(f"tensor {name!r}: row of {shape[0]} elements is not a multiple of "
                             f"{ggml_type.name}'s block size {ggml_type.block_size}")
        return shape

    def _check_tensor_name(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a tensor name must be a non-empty str, got {name!r}")
        try:
            encoded = name.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as exc:
            raise ValueError(f"tensor name {name!r} cannot be encoded: {exc}") from None
        if len(encoded) > MAX_NAME_BYTES:
            raise ValueError(f"tensor name {name!r} is longer than {MAX_NAME_BYTES} bytes")
        if name in self._tensors:
            raise ValueError(f"tensor {name!r} was already added")

    @staticmethod
    def _default_shape(name: str, data: np.ndarray, ggml_type: GGMLType,
                       raw_bytes: bool) -> tuple[int, ...]:
        if not raw_bytes:
            return data.shape[::-1]
        if data.ndim == 0 or data.shape[-1] % ggml_type.type_size:
            raise ValueError(f"tensor {name!r}: pass shape= for {ggml_type.name} bytes of "
                             f"numpy shape {data.shape}")
        row = data.shape[-1] // ggml_type.type_size * ggml_type.block_size
        return (row, *data.shape[-2::-1])

    # -- output

    def write(self, *, split_max_tensors: int = 0, split_max_size: int = 0,
              split_parts: Sequence[int] | None = None) -> list[Path]:
        """Write the file, or split parts when a limit is given and more than one part results.

        Parameters
        ----------
        split_max_tensors
            At most this many tensors per part (0: no limit).
        split_max_size
            Start a new part before a tensor that would take the part's tensor bytes past this
            (0: no limit). A part always holds at least one tensor.
        split_parts
            Instead of limits: the part (0, 1, ...) of each tensor in the order they were added,
            non-decreasing (llama.cpp's ``--keep-split`` keeps its input's shards this way).

        Returns
        -------
        list[Path]
            The files written. Parts other than the first hold only the ``split.*`` keys (and
            ``general.alignment`` when it is not the default), like gguf-py's and llama.cpp's.
        """
        if split_max_tensors < 0 or split_max_size < 0:
            raise ValueError("split limits must be >= 0")
        if split_parts is not None:
            groups = self._given_parts(list(split_parts))
        else:
            groups = self._partition(split_max_tensors, split_max_size)
        if len(groups) == 1:
            plan = [(self.path, self._kv, groups[0])]
        else:
            plan = self._split_plan(groups)
        written = []
        try:
            for path, kv, tensors in plan:
                self._write_part(path, kv, tensors)
                written.append(path)
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise
        return written

    def _partition(self, max_tensors: int, max_size: int) -> list[list[_PendingTensor]]:
        groups: list[list[_PendingTensor]] = [[]]
        size = 0
        for t in self._tensors.values():
            current = groups[-1]
            if current and ((max_tensors and len(current) >= max_tensors)
                            or (max_size and size + t.nbytes > max_size)):
                groups.append([])
                size = 0
            groups[-1].append(t)
            size += t.nbytes
        return groups

    def _given_parts(self, parts: list[int]) -> list[list[_PendingTensor]]:
        tensors = list(self._tensors.values())
        if len(parts) != len(tensors):
            raise ValueError(f"split_parts names {len(parts)} parts for {len(tensors)} tensors")
        if parts and (parts[0] != 0 or any(b - a not in (0, 1) for a, b in zip(parts, parts[1:]))):
            raise ValueError("split_parts must count up from 0 without gaps")
        groups: list[list[_PendingTensor]] = [[] for _ in range(parts[-1] + 1 if parts else 1)]
        for part, t in zip(parts, tensors):
            groups[part].append(t)
        return groups

    def _split_plan(self, groups: list[list[_PendingTensor]]) -> list[tuple]:
        count = len(groups)
        if count > _MAX_SPLIT_PARTS:
            raise ValueError(f"{count} split parts, at most {_MAX_SPLIT_PARTS}")
        prefix = self.path.with_suffix("") if self.path.suffix == ".gguf" else self.path
        plan = []
        for i, tensors in enumerate(groups):
            kv = dict(self._kv) if i == 0 else {}
            if i and KEY_ALIGNMENT in self._kv:
                kv[KEY_ALIGNMENT] = self._kv[KEY_ALIGNMENT]
            for key, vtype, value in ((KEY_SPLIT_NO, _T.UINT16, i),
                                      (KEY_SPLIT_COUNT, _T.UINT16, count),
                                      (KEY_SPLIT_TENSORS_COUNT, _T.INT32, len(self._tensors))):
                kv[key] = _entry(key, vtype, _encode_numbers([value], vtype))
            plan.append((split_path(prefix, i, count), kv, tensors))
        return plan

    def _write_part(self, path: Path, kv: dict[str, bytes], tensors: list[_PendingTensor]) -> None:
        infos = bytearray()
        offset = 0
        for t in tensors:
            infos += _encode_str(t.name) + U32.pack(len(t.shape))
            infos += b"".join(U64.pack(d) for d in t.shape)
            infos += U32.pack(t.type) + U64.pack(offset)
            offset += align_up(t.nbytes, self.alignment)
        head = bytearray(HEADER.pack(GGUF_MAGIC, GGUF_VERSION, len(tensors), len(kv)))
        head += b"".join(kv.values())
        head += infos
        if tensors:  # a metadata-only file ends here, as gguf-py's vocab-only files do
            head += bytes(align_up(len(head), self.alignment) - len(head))
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                for t in tensors:
                    f.write(_tensor_bytes(t))
                    f.write(bytes(align_up(t.nbytes, self.alignment) - t.nbytes))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
