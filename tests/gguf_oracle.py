"""What the gguf PyPI package (gguf-py) reads from a GGUF file, as plain values to compare with.

Both sides are reduced to one shape: per metadata key the type path gguf-py reports (``[ARRAY,
FLOAT32]``) and the raw bytes of every leaf value in order; per tensor its name, type, shape,
offset, size and a hash of its data bytes. :func:`digest` shrinks a view to hashes per key.

gguf-py maps files with ``np.memmap``, whose per-slice bookkeeping makes it take minutes over the
vocab files; :func:`gguf_py_view` hands it a plain array of the same bytes instead (its parsing
code is unchanged). Even so it needs about a minute of CPU for the vocab suite, so
:class:`GGUFPyOracle` runs it in worker processes and remembers its digests in pytest's cache,
keyed by file name, size, modification time and gguf version.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import hashlib
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import numpy as np

from gguflm.gguf import GGUFReader, GGUFValueType
from gguflm.gguf.constants import value_type_of_dtype

View = dict[str, Any]


def _digest(data: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(data).reshape(-1).view(np.uint8)).hexdigest()


class _NumpyWithPlainMap:
    """The numpy module, except that ``memmap`` returns a plain read-only array of the file."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def memmap(path: str | os.PathLike, mode: str = "r") -> np.ndarray:
        data = np.fromfile(path, dtype=np.uint8)
        data.flags.writeable = False
        return data


def gguf_py_view(path: str | os.PathLike) -> View:
    """gguf-py's reading of ``path`` (metadata type paths and leaf bytes, tensor table)."""
    import gguf
    import gguf.gguf_reader

    gguf.gguf_reader.np = _NumpyWithPlainMap()
    reader = gguf.GGUFReader(path)
    fields = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # header pseudo-fields
            continue
        leaves = [bytes(field.parts[i].tobytes()) for i in field.data]
        fields[key] = ([t.name for t in field.types], leaves)
    tensors = [
        (t.name, t.tensor_type.name, tuple(int(d) for d in t.shape),
         int(t.data_offset), int(t.n_bytes), int(t.n_elements), _digest(t.data))
        for t in reader.tensors
    ]
    return {"fields": fields, "tensors": tensors, "alignment": int(reader.alignment)}


def _type_path(value: Any, vtype: GGUFValueType) -> list[str]:
    """gguf-py's ``field.types``: the value's type, then its first element's, recursively."""
    if vtype is not GGUFValueType.ARRAY or len(value) == 0:
        return [vtype.name]
    return [vtype.name, *_type_path(value[0], _inner_type(value))]


def _inner_type(items: Any) -> GGUFValueType:
    if isinstance(items, np.ndarray):
        return value_type_of_dtype(items.dtype)
    if items and isinstance(items[0], str):
        return GGUFValueType.STRING
    return GGUFValueType.ARRAY  # nested, or empty (gguf-py reports no element type then)


def _leaves(value: Any, vtype: GGUFValueType) -> list[bytes]:
    if vtype is GGUFValueType.STRING:
        return [value.encode("utf-8", "surrogateescape")]
    if vtype is GGUFValueType.ARRAY:
        if isinstance(value, np.ndarray):
            rows = np.ascontiguousarray(value).view(np.uint8).reshape(len(value), value.itemsize)
            return [row.tobytes() for row in rows]
        return [leaf for item in value for leaf in _leaves(item, _element_of(item))]
    return [np.array(value, dtype=vtype.dtype).tobytes()]


def _element_of(item: Any) -> GGUFValueType:
    return GGUFValueType.STRING if isinstance(item, str) else GGUFValueType.ARRAY


def our_view(reader: GGUFReader) -> View:
    """Our reader's view of an open file, in the shape of :func:`gguf_py_view`."""
    fields = {}
    for key, value in reader.metadata.items():
        vtype = reader.value_types[key]
        if vtype is GGUFValueType.ARRAY and len(value):
            types = [vtype.name, *_type_path(value[0], reader.array_type(key))]
        else:
            types = _type_path(value, vtype)
        fields[key] = (types, _leaves(value, vtype))
    tensors = [
        (t.name, t.type.name, t.shape, t.file_offset, t.nbytes, t.n_elements, _digest(t.data))
        for t in reader.tensors
    ]
    return {"fields": fields, "tensors": tensors, "alignment": reader.alignment}


def digest(view: View) -> View:
    """``view`` with each key's leaves replaced by their count and a hash (JSON-friendly)."""
    fields = {}
    for key, (types, leaves) in view["fields"].items():
        h = hashlib.sha256()
        for leaf in leaves:
            h.update(len(leaf).to_bytes(8, "little"))
            h.update(leaf)
        fields[key] = [types, len(leaves), h.hexdigest()]
    # as JSON would give it back from the cache (tuples become lists)
    return json.loads(json.dumps(
        {"fields": fields, "tensors": view["tensors"], "alignment": view["alignment"]}))


def gguf_py_digest(path: Path) -> View:
    return digest(gguf_py_view(path))


class GGUFPyOracle:
    """gguf-py's digests of a set of files: from pytest's cache, else computed in the background."""

    def __init__(self, paths: list[Path], cache: Any | None) -> None:
        from importlib.metadata import version

        gguf_version = version("gguf")
        self._cache = cache
        self._keys = {}
        self._done: dict[Path, View] = {}
        self._futures: dict[Path, concurrent.futures.Future] = {}
        for path in paths:
            st = path.stat()
            self._keys[path] = (f"gguflm/gguf-py-digest/{gguf_version}/"
                                f"{path.name}-{st.st_size}-{st.st_mtime_ns}")
            hit = None if cache is None else cache.get(self._keys[path], None)
            if hit is not None:
                self._done[path] = hit
        todo = sorted((p for p in paths if p not in self._done), key=lambda p: -p.stat().st_size)
        if todo:
            pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=min(2, os.cpu_count() or 1),
                mp_context=multiprocessing.get_context("spawn"))
            atexit.register(pool.shutdown, cancel_futures=True)
            self._futures = {path: pool.submit(gguf_py_digest, path) for path in todo}

    def __getitem__(self, path: Path) -> View:
        if path not in self._done:
            self._done[path] = self._futures[path].result()
            if self._cache is not None:
                self._cache.set(self._keys[path], self._done[path])
        return self._done[path]
