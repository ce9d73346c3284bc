"""Read GGUF files: header, metadata and tensor index, with zero-copy numpy views of the data.

Every structural check llama.cpp's ``gguf_init_from_file`` makes is made here too, plus the ones
it leaves to later stages (tensor data inside the file, aligned, not overlapping). Each failure is
a :class:`~gguflm.errors.GGUFError` naming the file, the byte offset, what was expected and what
was found. Counts and lengths are checked against the bytes left before anything is allocated.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args

import numpy as np

from gguflm._ext.gguf_strings import decode_string_array
from gguflm.errors import GGUFError
from gguflm.ggml_types import GGMLType
from gguflm.gguf.constants import (
    DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    HEADER,
    INT64_MAX,
    KEY_ALIGNMENT,
    KEY_SPLIT_COUNT,
    KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS_COUNT,
    MAX_ARRAY_DEPTH,
    MAX_DIMS,
    MAX_NAME_BYTES,
    SUPPORTED_VERSIONS,
    TENSOR_DTYPES,
    U32,
    U64,
    GGUFValueType,
    align_up,
    split_path,
    split_prefix,
)

_MISSING: Any = object()

_SCALAR_STRUCTS = {t: struct.Struct(t.struct_format) for t in GGUFValueType if t.struct_format}

# fewest bytes of one metadata entry (key of 1 byte, type, a 1-byte value) and one tensor info
# (name of 1 byte, n_dims = 0, type, offset): a count larger than the bytes left allow is absurd
_MIN_KV_BYTES = U64.size + 1 + U32.size + 1
_MIN_TENSOR_INFO_BYTES = U64.size + 1 + U32.size + U32.size + U64.size


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of the index: where its bytes are and how to read them.

    ``shape`` is in ggml order (``ne[0]``, the row length, first). ``data`` is a read-only
    zero-copy view: for types stored one element per block a typed array of numpy shape
    ``reversed(shape)`` (BF16 as uint16), for block types the raw bytes as uint8 of shape
    ``(*reversed(shape[1:]), row_bytes)``.
    """

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    offset: int  # relative to the data section of its part, as stored
    file_offset: int  # absolute, in its part
    part: int
    n_elements: int
    nbytes: int
    data: np.ndarray = field(repr=False, compare=False)


class _RawTensor(NamedTuple):
    """A tensor info as read, before its data is located."""

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    n_elements: int
    offset: int
    stored_at: int  # file offset of the stored data offset, for error messages


@dataclass(slots=True)
class _Part:
    """What one file of a (possibly split) model holds."""

    path: Path
    version: int
    alignment: int
    metadata: dict[str, Any]
    value_types: dict[str, GGUFValueType]
    array_types: dict[str, GGUFValueType]
    tensors: list[TensorInfo]


class _Parser:
    """Parses one file held in ``buf`` (an mmap or bytes); ``base`` is the same bytes as uint8."""

    def __init__(self, path: Path, buf: mmap.mmap | bytes, part: int) -> None:
        self.path = path
        self.buf = buf
        self.size = len(buf)
        self.base = np.frombuffer(buf, dtype=np.uint8)
        self.base.flags.writeable = False  # read mode's private map too: every view is read-only
        self.part = part

    # -- failures and bounded reads

    def fail(self, offset: int, expected: str, found: str) -> GGUFError:
        return GGUFError(f"{self.path}: at byte {offset}: expected {expected}, found {found}")

    def need(self, offset: int, n: int, what: str) -> None:
        if n > self.size - offset:
            left = max(self.size - offset, 0)
            raise self.fail(offset, f"{what} ({n} bytes)", f"end of file ({left} bytes left)")

    def unpack(self, fmt: struct.Struct, offset: int, what: str) -> Any:
        self.need(offset, fmt.size, what)
        return fmt.unpack_from(self.buf, offset)[0]

    def string(self, offset: int, what: str, max_bytes: int | None = None) -> tuple[str, int]:
        length = self.unpack(U64, offset, f"length of {what}")
        if max_bytes is not None and length > max_bytes:
            raise self.fail(offset, f"{what} of at most {max_bytes} bytes", f"{length} bytes")
        start = offset + U64.size
        if length > self.size - start:
            raise self.fail(offset, f"{what} of {length} bytes",
                            f"end of file ({self.size - start} bytes left)")
        return str(self.buf[start : start + length], "utf-8", "surrogateescape"), start + length

    def value_type(self, offset: int, what: str) -> GGUFValueType:
        raw = self.unpack(U32, offset, what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.fail(offset, f"{what} (0..{max(GGUFValueType)})", str(raw)) from None

    # -- metadata values

    def scalar(self, offset: int, vtype: GGUFValueType, what: str) -> tuple[Any, int]:
        if vtype is GGUFValueType.STRING:
            return self.string(offset, what)
        fmt = _SCALAR_STRUCTS[vtype]
        return self.unpack(fmt, offset, f"{what} ({vtype.name})"), offset + fmt.size

    def array(self, offset: int, what: str, depth: int) -> tuple[Any, GGUFValueType, int]:
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(offset, f"arrays nested at most {MAX_ARRAY_DEPTH} deep",
                            "deeper nesting")
        etype = self.value_type(offset, f"element type of {what}")
        count = self.unpack(U64, offset + U32.size, f"element count of {what}")
        start = offset + U32.size + U64.size
        left = self.size - start
        if count > left // etype.min_encoded_size:
            raise self.fail(
                offset + U32.size,
                f"a count of {etype.name} elements that fits in the {left} bytes left",
                f"{count} elements",
            )
        if etype is GGUFValueType.STRING:
            strings, end = decode_string_array(self.buf, start, count)
            if strings is None:  # let the scalar reader describe the string that does not fit
                self.string(end, f"string element of {what}")
            return strings, etype, end
        if etype is GGUFValueType.ARRAY:
            items = []
            end = start
            for i in range(count):
                item, _, end = self.array(end, f"element {i} of {what}", depth + 1)
                items.append(item)
            return items, etype, end
        end = start + count * etype.dtype.itemsize
        raw = self.base[start:end]
        if etype is GGUFValueType.BOOL and raw.size and raw.max() > 1:
            return raw != 0, etype, end  # ggml reads any non-zero byte as true; numpy bool can't
        return raw.view(etype.dtype), etype, end

    # -- the whole file

    def parse(self) -> _Part:
        if self.size < len(GGUF_MAGIC) or self.buf[: len(GGUF_MAGIC)] != GGUF_MAGIC:
            found = bytes(self.buf[: len(GGUF_MAGIC)])
            raise self.fail(0, f"magic {GGUF_MAGIC!r}", repr(found) if found else "an empty file")
        self.need(0, HEADER.size, "GGUF header")
        _, version, n_tensors, n_kv = HEADER.unpack_from(self.buf, 0)
        self.check_version(version)
        offset = HEADER.size
        left = self.size - offset
        if n_kv > left // _MIN_KV_BYTES:
            raise self.fail(16, f"a metadata count that fits in the {left} bytes left", str(n_kv))
        if n_tensors > left // _MIN_TENSOR_INFO_BYTES:
            raise self.fail(8, f"a tensor count that fits in the {left} bytes left", str(n_tensors))

        metadata: dict[str, Any] = {}
        value_types: dict[str, GGUFValueType] = {}
        array_types: dict[str, GGUFValueType] = {}
        key_offsets: dict[str, int] = {}
        for i in range(n_kv):
            key_offset = offset
            key, offset = self.string(offset, f"key of metadata entry {i}")
            if not key:
                raise self.fail(key_offset, f"a non-empty key for metadata entry {i}", "''")
            if key in metadata:
                raise self.fail(key_offset, "a new key", f"duplicate key {key!r}")
            vtype = self.value_type(offset, f"value type of {key!r}")
            offset += U32.size
            if vtype is GGUFValueType.ARRAY:
                value, array_types[key], offset = self.array(offset, repr(key), 0)
            else:
                value, offset = self.scalar(offset, vtype, f"value of {key!r}")
            metadata[key], value_types[key], key_offsets[key] = value, vtype, key_offset

        alignment = DEFAULT_ALIGNMENT
        if KEY_ALIGNMENT in metadata:
            alignment = metadata[KEY_ALIGNMENT]
            where = key_offsets[KEY_ALIGNMENT]
            if value_types[KEY_ALIGNMENT] is not GGUFValueType.UINT32:
                raise self.fail(where, f"{KEY_ALIGNMENT} of type UINT32",
                                value_types[KEY_ALIGNMENT].name)
            if alignment == 0 or alignment & (alignment - 1):
                raise self.fail(where, f"{KEY_ALIGNMENT} a power of two", str(alignment))

        infos, offset = self.tensor_infos(offset, n_tensors)
        data_offset = align_up(offset, alignment)
        if infos and data_offset > self.size:
            raise self.fail(offset, f"padding to the data section at byte {data_offset}",
                            f"end of file at byte {self.size}")
        tensors = self.bind_tensors(infos, data_offset, alignment)
        return _Part(self.path, version, alignment, metadata, value_types, array_types, tensors)

    def check_version(self, version: int) -> None:
        if version == 0:
            raise self.fail(4, "GGUF version 2 or 3", "version 0")
        if version & 0xFFFF == 0:  # a small version read in the wrong byte order
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            raise self.fail(
                4, "a little-endian GGUF file",
                f"version field {version:#010x}, i.e. version {swapped} written big-endian; "
                "big-endian GGUF files are not supported",
            )
        if version == 1:
            raise self.fail(4, "GGUF version 2 or 3", "version 1 (GGUFv1 is no longer supported)")
        if version not in SUPPORTED_VERSIONS:
            raise self.fail(4, "GGUF version 2 or 3", f"version {version}")

    def tensor_infos(self, offset: int, count: int) -> tuple[list[_RawTensor], int]:
        infos = []
        names: set[str] = set()
        for i in range(count):
            name_offset = offset
            name, offset = self.string(offset, f"name of tensor {i}", MAX_NAME_BYTES)
            if name in names:
                raise self.fail(name_offset, "a new tensor name", f"duplicate tensor {name!r}")
            names.add(name)
            what = f"tensor {name!r}"
            n_dims = self.unpack(U32, offset, f"dimension count of {what}")
            if n_dims > MAX_DIMS:
                raise self.fail(offset, f"at most {MAX_DIMS} dimensions for {what}", str(n_dims))
            offset += U32.size
            shape = []
            n_elements = 1
            for j in range(n_dims):
                dim = self.unpack(U64, offset, f"dimension {j} of {what}")
                if not 0 < dim <= INT64_MAX:
                    raise self.fail(offset, f"dimension {j} of {what} in 1..{INT64_MAX}",
                                    str(dim if dim <= INT64_MAX else dim - 2**64))
                n_elements *= dim
                if n_elements >= INT64_MAX:
                    raise self.fail(offset, f"fewer than {INT64_MAX} elements in {what}",
                                    f"shape {shape + [dim]} so far")
                shape.append(dim)
                offset += U64.size
            raw_type = self.unpack(U32, offset, f"ggml type of {what}")
            try:
                ggml_type = GGMLType(raw_type)
            except ValueError:
                raise self.fail(offset, f"a known ggml type for {what}", str(raw_type)) from None
            row = shape[0] if shape else 1
            if row % ggml_type.block_size:
                raise self.fail(
                    offset, f"a row length that is a multiple of {ggml_type.name}'s block size "
                    f"{ggml_type.block_size} for {what}", f"{row} elements per row")
            offset += U32.size
            data_offset = self.unpack(U64, offset, f"data offset of {what}")
            infos.append(_RawTensor(name, ggml_type, tuple(shape), n_elements, data_offset, offset))
            offset += U64.size
        return infos, offset

    def bind_tensors(self, infos: list[_RawTensor], data_offset: int,
                     alignment: int) -> list[TensorInfo]:
        tensors = []
        extents = []
        for name, ggml_type, shape, n_elements, offset, stored_at in infos:
            nbytes = n_elements // ggml_type.block_size * ggml_type.type_size
            if offset % alignment:
                raise self.fail(stored_at, f"a data offset for {name!r} that is a multiple of "
                                f"{alignment}", str(offset))
            start = data_offset + offset
            if offset > self.size or nbytes > self.size - start:
                raise self.fail(
                    stored_at,
                    f"the {nbytes} bytes of {name!r} inside the file ({self.size} bytes)",
                    f"data at bytes {start}..{start + nbytes}")
            raw = self.base[start : start + nbytes]
            if ggml_type in TENSOR_DTYPES:
                view = raw.view(TENSOR_DTYPES[ggml_type]).reshape(shape[::-1])
            else:
                view = raw.reshape(*shape[:0:-1], ggml_type.row_bytes(shape[0]))
            tensors.append(TensorInfo(name, ggml_type, shape, offset, start, self.part,
                                      n_elements, nbytes, view))
            extents.append((offset, offset + nbytes, name, stored_at))
        extents.sort()
        for (_, end, before, _), (begin, _, name, stored_at) in zip(extents, extents[1:]):
            if begin < end:
                raise self.fail(stored_at, f"data of {name!r} after the end of {before!r} "
                                f"(data offset {end} or more)", f"data offset {begin}")
        return tensors


def _detached(value: Any) -> Any:
    """``value`` with numpy views into a file replaced by private copies."""
    if isinstance(value, np.ndarray):
        copy = value.copy()
        copy.flags.writeable = False
        return copy
    if isinstance(value, list) and value and not isinstance(value[0], str):
        return [_detached(item) for item in value]
    return value


# how a reader holds the file: "mmap" maps it read-only, "read" copies it into private memory
ReaderMode = Literal["mmap", "read"]
READER_MODES: tuple[str, ...] = get_args(ReaderMode)


class GGUFReader:
    """A GGUF file (or all parts of a split one): metadata, tensor index, zero-copy tensor views.

    Parameters
    ----------
    path
        The file; for a split model the first part, ``name-00001-of-0000N.gguf``, whose
        ``split.count`` makes the reader open the other parts next to it.
    mode
        ``"mmap"`` maps the files read-only and every view points into the map; ``"read"``
        reads them into private memory first (an anonymous map: nothing stays tied to the files).
        Either way :meth:`release` gives back the pages under a tensor a caller has copied.

    Attributes
    ----------
    path, paths, n_parts
        The first part, all parts, their number.
    version, alignment
        Of the first part.
    metadata
        Key → value, in file order: ``int``/``float``/``bool``/``str`` scalars; arrays as a
        ``list[str]`` (strings), a read-only numpy array (numbers and bools, zero-copy) or a
        ``list`` of arrays (nested arrays). Split models: the first part's metadata.
    value_types
        Key → :class:`GGUFValueType`; :meth:`array_type` gives an array's element type.
    tensors
        :class:`TensorInfo` of every tensor of every part, in file order.

    Notes
    -----
    :meth:`close` releases the maps and their file descriptors. A map that numpy views still
    point into cannot be closed without making those views dangle, so then the reader only
    drops its references and the map is unmapped when the last view is garbage collected.
    Strings that are not valid UTF-8 decode with ``surrogateescape`` and write back unchanged.
    """

    def __init__(self, path: str | PathLike[str], *, mode: ReaderMode = "mmap"):
        if mode not in READER_MODES:
            raise ValueError(f"mode must be one of {READER_MODES}, got {mode!r}")
        self.path = Path(path)
        self.mode = mode
        self._buffers: list[mmap.mmap | bytes] = []
        self.metadata: dict[str, Any] = {}
        self.tensors: list[TensorInfo] = []
        self._by_name: dict[str, TensorInfo] = {}
        try:
            parts = self._open_parts()
        except BaseException:
            self.close()
            raise
        first = parts[0]
        self.paths = tuple(part.path for part in parts)
        self.n_parts = len(parts)
        self.version = first.version
        self.alignment = first.alignment
        self.metadata = first.metadata
        self.value_types = first.value_types
        self._array_types = first.array_types
        self.tensors = [t for part in parts for t in part.tensors]
        self._by_name = {t.name: t for t in self.tensors}

    # -- opening

    def _parse(self, path: Path, part: int) -> _Part:
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                if not size:
                    buf: mmap.mmap | bytes = b""
                elif self.mode == "read":
                    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # freeable by release()
                    if hasattr(mmap, "MADV_HUGEPAGE"):   # weights stream ~20% faster from 2 MiB pages
                        buf.madvise(mmap.MADV_HUGEPAGE)
                    f.seek(0)
                    if f.readinto(buf) != size:
                        buf.close()
                        raise OSError(f"the file shrank while it was read ({size} bytes expected)")
                else:
                    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise GGUFError(f"{path}: cannot open: {exc.strerror or exc}") from exc
        self._buffers.append(buf)
        return _Parser(path, buf, part).parse()

    def _open_parts(self) -> list[_Part]:
        first = self._parse(self.path, 0)
        count = self._split_int(first, KEY_SPLIT_COUNT, required=False)
        if count is None or count <= 1:
            return [first]
        index = self._split_int(first, KEY_SPLIT_NO)
        if index != 0:
            raise GGUFError(f"{self.path}: this is part {index + 1} of a split model; "
                            f"open the first part instead")
        prefix = split_prefix(self.path)
        if prefix is None:
            raise GGUFError(f"{self.path}: {KEY_SPLIT_COUNT} is {count} but the name does not "
                            f"follow the split pattern <name>-00001-of-{count:05d}.gguf")
        expected_tensors = self._split_int(first, KEY_SPLIT_TENSORS_COUNT)
        parts = [first]
        names = {t.name for t in first.tensors}
        for i in range(1, count):
            path = split_path(prefix, i, count)
            if not path.is_file():
                raise GGUFError(f"{self.path}: split part {i + 1} of {count} is missing: {path}")
            part = self._parse(path, i)
            if self._split_int(part, KEY_SPLIT_NO) != i:
                raise GGUFError(f"{path}: expected {KEY_SPLIT_NO} = {i}, found "
                                f"{part.metadata[KEY_SPLIT_NO]}")
            for t in part.tensors:
                if t.name in names:
                    raise GGUFError(f"{path}: tensor {t.name!r} is also in an earlier part")
                names.add(t.name)
            parts.append(part)
        if expected_tensors != len(names):
            raise GGUFError(f"{self.path}: {KEY_SPLIT_TENSORS_COUNT} is {expected_tensors} but the "
                            f"{count} parts hold {len(names)} tensors")
        return parts

    @staticmethod
    def _split_int(part: _Part, key: str, required: bool = True) -> int | None:
        if key not in part.metadata:
            if required:
                raise GGUFError(f"{part.path}: split model without the key {key!r}")
            return None
        if not part.value_types[key].is_integer:
            raise GGUFError(f"{part.path}: key {key!r}: expected an integer, found "
                            f"{part.value_types[key].name}")
        return int(part.metadata[key])

    def release(self, view: np.ndarray) -> None:
        """Give back the memory pages wholly inside ``view`` (a tensor's data, which the caller has
        copied and will not read through this reader again): a map's pages are dropped from the
        process (the file's come back from the page cache if read again; read mode's are freed)."""
        page = mmap.PAGESIZE
        start = view.__array_interface__["data"][0]
        for buf in self._buffers:
            if not isinstance(buf, mmap.mmap) or buf.closed:
                continue
            base = np.frombuffer(buf, dtype=np.uint8).__array_interface__["data"][0]
            if base <= start and start + view.nbytes <= base + len(buf):
                first = -(-(start - base) // page) * page
                last = (start - base + view.nbytes) // page * page
                if last > first:
                    buf.madvise(mmap.MADV_DONTNEED, first, last - first)
                return

    # -- closing

    def close(self) -> None:
        """Release the maps and file descriptors (see the class notes about live views).

        Afterwards the reader holds no tensors; its metadata stays readable, arrays copied out of
        the map.
        """
        self.tensors = []
        self._by_name = {}
        self.metadata = {key: _detached(value) for key, value in self.metadata.items()}
        buffers, self._buffers = self._buffers, []
        for buf in buffers:
            if isinstance(buf, mmap.mmap):
                try:
                    buf.close()
                except BufferError:  # numpy views still point into it: unmapped when they go
                    pass

    def __enter__(self) -> GGUFReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- metadata

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when absent."""
        return self.metadata.get(key, default)

    def array_type(self, key: str) -> GGUFValueType | None:
        """Element type of the array ``key`` (None for a scalar; KeyError when absent)."""
        if key not in self.value_types:
            raise self._missing("key", key)
        return self._array_types.get(key)

    def _typed(self, key: str, default: Any, accepts: Callable[[GGUFValueType], bool],
               expected: str) -> Any:
        if key not in self.metadata:
            if default is _MISSING:
                raise self._missing("key", key)
            return default
        vtype = self.value_types[key]
        if not accepts(vtype):
            found = vtype.name
            if vtype is GGUFValueType.ARRAY:
                found = f"ARRAY of {self._array_types[key].name}"
            raise GGUFError(f"{self.path}: key {key!r}: expected {expected}, found {found}")
        return self.metadata[key]

    def get_int(self, key: str, default: Any = _MISSING) -> int:
        """An integer value (any integer type); KeyError when absent without default."""
        return self._typed(key, default, lambda t: t.is_integer, "an integer")

    def get_float(self, key: str, default: Any = _MISSING) -> float:
        """A float value (FLOAT32/FLOAT64, or an integer type, converted)."""
        value = self._typed(key, default, lambda t: t.is_float or t.is_integer, "a float")
        return float(value) if key in self.metadata else value

    def get_bool(self, key: str, default: Any = _MISSING) -> bool:
        """A BOOL value."""
        return self._typed(key, default, lambda t: t is GGUFValueType.BOOL, "BOOL")

    def get_str(self, key: str, default: Any = _MISSING) -> str:
        """A STRING value."""
        return self._typed(key, default, lambda t: t is GGUFValueType.STRING, "STRING")

    def get_array(self, key: str, default: Any = _MISSING) -> Any:
        """An ARRAY value: ``list[str]``, a read-only numpy array, or a list of arrays."""
        return self._typed(key, default, lambda t: t is GGUFValueType.ARRAY, "ARRAY")

    # -- tensors

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called ``name`` (KeyError when absent)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise self._missing("tensor", name) from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def _missing(self, what: str, name: str) -> KeyError:
        return KeyError(f"{what} {name!r} not found in {self.path}")

    def __repr__(self) -> str:
        return (f"GGUFReader({str(self.path)!r}, version={self.version}, "
                f"n_parts={self.n_parts}, n_kv={len(self.metadata)}, "
                f"n_tensors={len(self.tensors)})")
