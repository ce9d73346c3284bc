"""``gguflm inspect``: a plain-text description of a GGUF file.

Header, metadata (long arrays summarised), the tensor table, totals, parameter count, bits per
weight and the file type name, as llama.cpp's loader logs them when it opens a model.
"""

from __future__ import annotations

from collections import defaultdict
from os import PathLike
from typing import Any

import numpy as np

from gguflm.ggml_types import FILE_TYPE_GUESSED, FileType, GGMLType
from gguflm.gguf import GGUFReader, GGUFValueType
from gguflm.gguf.constants import KEY_FILE_TYPE, value_type_of_dtype

_MAX_STRING_CHARS = 72


def file_type_name(reader: GGUFReader) -> str:
    """The file type's display name, e.g. ``"Q4_K - Medium"``.

    From ``general.file_type`` when the file has it; otherwise guessed from the tensor type that
    holds the most bytes, e.g. ``"Q8_0 (guessed)"``.
    """
    if KEY_FILE_TYPE in reader.metadata:
        value = reader.get_int(KEY_FILE_TYPE)
        guessed = " (guessed)" if value & FILE_TYPE_GUESSED else ""
        try:
            return FileType(value & ~FILE_TYPE_GUESSED).display_name + guessed
        except ValueError:
            return f"unknown file type {value}"
    bytes_by_type = _bytes_by_type(reader)
    if not bytes_by_type:
        return "no tensors"
    dominant = max(bytes_by_type, key=bytes_by_type.__getitem__)
    return f"{dominant.name} (guessed)"


def _bytes_by_type(reader: GGUFReader) -> dict[GGMLType, int]:
    totals: dict[GGMLType, int] = defaultdict(int)
    for t in reader.tensors:
        totals[t.type] += t.nbytes
    return totals


def _format_scalar(value: Any, vtype: GGUFValueType) -> str:
    if vtype is GGUFValueType.STRING:
        text = repr(value)  # quotes, escapes newlines and undecodable bytes
        return text if len(text) <= _MAX_STRING_CHARS else text[: _MAX_STRING_CHARS - 3] + "..."
    if vtype is GGUFValueType.FLOAT32:
        return str(np.float32(value))  # the shortest text that reads back as the same float32
    return str(value.item() if isinstance(value, np.generic) else value)


def _format_array(value: Any, etype: GGUFValueType, max_items: int) -> str:
    shown = [
        _format_array(item, _element_type(item), max_items) if etype is GGUFValueType.ARRAY
        else _format_scalar(item, etype)
        for item in value[:max_items]
    ]
    more = ", ..." if len(value) > max_items else ""
    return f"[{', '.join(shown)}{more}]"


def _element_type(nested: Any) -> GGUFValueType:
    """Element type of an inner array of a nested array value."""
    if isinstance(nested, np.ndarray):
        return value_type_of_dtype(nested.dtype)
    return GGUFValueType.STRING if nested and isinstance(nested[0], str) else GGUFValueType.ARRAY


def _format_entry(reader: GGUFReader, key: str, max_items: int) -> tuple[str, str]:
    vtype = reader.value_types[key]
    value = reader.metadata[key]
    if vtype is not GGUFValueType.ARRAY:
        return vtype.name, _format_scalar(value, vtype)
    etype = reader.array_type(key)
    return f"ARRAY[{etype.name}, {len(value)}]", _format_array(value, etype, max_items)


def inspect_report(path: str | PathLike[str], *, max_items: int = 5) -> str:
    """Describe the GGUF file at ``path`` (all parts of a split model).

    Parameters
    ----------
    path
        The file, or the first part of a split model.
    max_items
        Items shown of each metadata array; longer arrays end with ``...``.

    Returns
    -------
    str
        The report: header, metadata, tensor table, per-type totals, parameter count, bits per
        weight and file type name.
    """
    with GGUFReader(path) as reader:
        return _report(reader, max_items)


def _report(reader: GGUFReader, max_items: int) -> str:
    tensors = reader.tensors
    n_params = sum(t.n_elements for t in tensors)
    n_bytes = sum(t.nbytes for t in tensors)
    lines = [
        f"file:        {reader.path}",
        f"parts:       {reader.n_parts}",
        f"version:     {reader.version}",
        f"alignment:   {reader.alignment}",
        f"keys:        {len(reader.metadata)}",
        f"tensors:     {len(tensors)}",
        "",
        "metadata:",
    ]
    entries = [(key, *_format_entry(reader, key, max_items)) for key in reader.metadata]
    key_width = max((len(key) for key, _, _ in entries), default=0)
    type_width = max((len(vtype) for _, vtype, _ in entries), default=0)
    lines += [f"  {key:<{key_width}}  {vtype:<{type_width}}  {text}"
              for key, vtype, text in entries]

    lines += ["", "tensors:"]
    split = reader.n_parts > 1
    rows = [("name", "type", "shape", "bytes") + (("part",) if split else ())]
    rows += [(t.name, t.type.name, " x ".join(map(str, t.shape)), f"{t.nbytes:,}")
             + ((str(t.part + 1),) if split else ()) for t in tensors]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.rjust(w) if i == 3 else cell.ljust(w) for i, (cell, w) in
                 enumerate(zip(row, widths))]
        lines.append("  " + "  ".join(cells).rstrip())

    lines += ["", "types:"]
    counts: dict[GGMLType, int] = defaultdict(int)
    for t in tensors:
        counts[t.type] += 1
    for ggml_type, type_bytes in sorted(_bytes_by_type(reader).items(), key=lambda kv: -kv[1]):
        lines.append(f"  {ggml_type.name:<8} {counts[ggml_type]:>5} tensors  "
                     f"{type_bytes:>15,} bytes")

    bpw = f"{8 * n_bytes / n_params:.2f}" if n_params else "n/a"
    lines += [
        "",
        "totals:",
        f"  tensors:          {len(tensors)}",
        f"  parameters:       {n_params:,} ({n_params / 1e6:.2f} M)",
        f"  tensor bytes:     {n_bytes:,} ({n_bytes / 2**20:.2f} MiB)",
        f"  bits per weight:  {bpw}",
        f"  file type:        {file_type_name(reader)}",
    ]
    return "\n".join(lines) + "\n"
