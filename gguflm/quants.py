"""Quantization formats and the kernels that compute with them, byte-exact with ggml.

A registry of formats, one per ggml type the kernels handle::

    fmt = gguflm.quants.get("Q4_K")           # or get(GGMLType.Q4_K)
    blob = fmt.quantize(x)                     # float32 rows -> uint8 blocks (ggml's reference)
    y = fmt.dequantize(blob)                   # -> float32
    s = fmt.dot(blob, v)                       # v quantized to fmt.vec_dot_type, then an integer dot

and the matrix product every forward pass runs on::

    out = gguflm.quants.matmul(w, "Q4_K", x, n_threads=2)    # [n_tok, n_rows]

Activations are quantized the way ggml's x86 CPU backend quantizes ``src1`` (Q8_0/Q8_1 with a
127/amax multiplier and round-half-even; Q8_K with its reference quantizer), which can differ in a
last bit from the weight-side reference quantizer of the same type. The kernels run the
instruction set of the one switch, :mod:`gguflm.system` (``set_isa``, ``GGUFLM_ISA``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Union

import numpy as np

from gguflm._ext import quants as _k
from gguflm.ggml_types import GGMLType
from gguflm.threads import resolve_n_threads

TypeLike = Union[str, GGMLType]

# numpy dtypes accepted as typed weight matrices besides raw uint8 bytes
_TYPED_WEIGHTS = {GGMLType.F32: np.dtype(np.float32), GGMLType.F16: np.dtype(np.float16),
                  GGMLType.BF16: np.dtype(np.uint16)}


@dataclass(frozen=True)
class Format:
    """One quantization format: sizes, its dot partner, and row (de)quantization."""

    name: str
    type: GGMLType
    block_size: int
    type_size: int
    vec_dot_type: GGMLType | None  # None: an activation-only format without a dot kernel

    def row_bytes(self, n: int) -> int:
        """Bytes of ``n`` elements; ValueError unless ``n`` is a whole number of blocks."""
        return _k.row_bytes(int(self.type), int(n))

    def quantize(self, x: np.ndarray, imatrix: np.ndarray | None = None,
                 out: np.ndarray | None = None) -> np.ndarray:
        """Quantize float32 rows as ``ggml_quantize_chunk`` does (ggml's reference quantizer, or
        with importance weights its weighted search).

        Parameters
        ----------
        x : array_like of float32, shape (k,) or (n, k)
            ``k`` must be a multiple of ``block_size``.
        imatrix : array_like of float32, shape (k,), optional
            ggml's ``quant_weights``: one importance weight per column (an importance matrix's
            entry for this tensor). Formats whose ggml quantizer ignores them give the same bytes
            as without.
        out : numpy.ndarray of uint8, shape (n, row_bytes(k)), optional
            C-contiguous rows to write the blocks into (2-D ``x`` only).

        Returns
        -------
        numpy.ndarray of uint8, shape (row_bytes(k),) or (n, row_bytes(k))
        """
        if imatrix is None:
            return self._quantize(x, activation=False, out=out)
        rows = _float_rows(x, "x")
        qw = _float_rows(imatrix, "imatrix")
        if qw.shape[0] != 1 or qw.shape[1] != rows.shape[1]:
            raise ValueError(f"imatrix must hold one weight per column ({rows.shape[1]}), got shape {np.shape(imatrix)}")
        out = self._out_rows(out, x, rows)
        _k.quantize_weighted(int(self.type), rows, out, qw[0])
        return out if np.ndim(x) == 2 else out[0]

    def _out_rows(self, out: np.ndarray | None, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        shape = (rows.shape[0], self.row_bytes(rows.shape[1]))
        if out is None:
            return np.empty(shape, dtype=np.uint8)
        if np.ndim(x) != 2:
            raise ValueError("out= needs 2-D x")
        if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != shape or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous uint8 of shape {shape}")
        return out

    def quantize_activations(self, x: np.ndarray) -> np.ndarray:
        """Quantize float32 rows as ggml's CPU backend quantizes matmul inputs (see module doc)."""
        return self._quantize(x, activation=True)

    def _quantize(self, x: np.ndarray, activation: bool, out: np.ndarray | None = None) -> np.ndarray:
        rows = _float_rows(x, "x")
        out = self._out_rows(out, x, rows)
        _k.quantize(int(self.type), rows, out, activation)
        return out if np.ndim(x) == 2 else out[0]

    def dequantize(self, blob: np.ndarray, n: int | None = None) -> np.ndarray:
        """Dequantize blocks to float32.

        Parameters
        ----------
        blob : numpy.ndarray, shape (b,) or (rows, b)
            uint8 bytes (any C-contiguous array is read as its bytes, e.g. float16 for F16).
        n : int, optional
            Elements per row; must match the row's bytes. By default every block of the row.

        Returns
        -------
        numpy.ndarray of float32, shape (n,) or (rows, n)
        """
        rows = _byte_rows(blob, "blob")
        n_bytes = rows.shape[1]
        if n is None:
            if n_bytes % self.type_size:
                raise ValueError(f"{self.name} rows are whole blocks of {self.type_size} bytes, got {n_bytes} bytes")
            n = n_bytes // self.type_size * self.block_size
        elif self.row_bytes(n) != n_bytes:
            raise ValueError(f"{n} {self.name} elements take {self.row_bytes(n)} bytes, the rows hold {n_bytes}")
        out = np.empty((rows.shape[0], n), dtype=np.float32)
        _k.dequantize(int(self.type), rows, out)
        return out if _is_2d_blob(blob) else out[0]

    def dot(self, w_blob: np.ndarray, x: np.ndarray) -> float:
        """Dot of one quantized weight row with float32 ``x``, computed as ggml does: ``x`` is
        quantized to ``vec_dot_type``, then integer sums per block, float scales per block."""
        partner = self._partner()
        x = _float_rows(x, "x")
        if x.shape[0] != 1:
            raise ValueError(f"x must be one row, got shape {x.shape}")
        w = _byte_rows(w_blob, "w_blob")
        if w.shape[0] != 1:
            raise ValueError(f"w_blob must be one row, got {w.shape[0]} rows")
        xq = partner.quantize_activations(x)
        return _k.vec_dot(int(self.type), w[0], xq[0], x.shape[1])

    def _partner(self) -> Format:
        if self.vec_dot_type is None:
            raise ValueError(f"{self.name} is an activation format without a dot kernel")
        return _FORMATS[self.vec_dot_type]


def _build_formats() -> dict[GGMLType, Format]:
    formats = {}
    for t in GGMLType:
        traits = _k.type_traits(int(t))
        if traits is not None:
            vdt = traits["vec_dot_type"]
            formats[t] = Format(traits["name"], t, traits["block_size"], traits["type_size"],
                                None if vdt is None else GGMLType(vdt))
    return formats


_FORMATS = _build_formats()


def get(t: TypeLike) -> Format:
    """The format of a ggml type, by name (``"Q4_K"``) or :class:`GGMLType`."""
    if isinstance(t, GGMLType):
        key = t
    elif isinstance(t, str):
        try:
            key = GGMLType[t.upper()]
        except KeyError:
            raise ValueError(f"unknown ggml type {t!r}") from None
    else:
        raise TypeError(f"expected a type name or GGMLType, got {type(t).__name__}")
    if key not in _FORMATS:
        raise ValueError(f"{key.name} is not handled by the quantization kernels; known: {', '.join(f.name for f in formats())}")
    return _FORMATS[key]


def formats() -> list[Format]:
    """Every format the kernels handle, in ggml type order."""
    return list(_FORMATS.values())


def act_buffer_bytes(vec_dot_type: TypeLike, n_tok: int, n_in: int) -> int:
    """Scratch bytes for ``n_tok`` activation rows of ``n_in`` elements quantized to ``vec_dot_type``."""
    return _k.act_buffer_bytes(int(get(vec_dot_type).type), int(n_tok), int(n_in))


def quantize_rows_for_dot(wtype: TypeLike, x: np.ndarray) -> np.ndarray:
    """Activations ``x`` [n_tok, n_in] quantized to ``wtype``'s dot partner, as matmul does it."""
    partner = get(wtype)._partner()
    rows = _float_rows(x, "x", require_2d=True)
    out = np.empty((rows.shape[0], partner.row_bytes(rows.shape[1])), dtype=np.uint8)
    _k.quantize_act(int(partner.type), rows, out, 1)
    return out


def _storage(fmt: Format, repacked: bool, rows16: bool) -> int:
    """The kernels' ``repacked`` value for a weight held as said."""
    if rows16 and not repacked:
        raise ValueError("a rows-16 weight is one llama.cpp repacks: rows16 needs repacked=True")
    if rows16 and fmt.type not in ROWS16_TYPES:
        raise ValueError(f"{fmt.type.name} has no rows-16 layout")
    return _k.REPACKED_ROWS16 if rows16 else _k.REPACKED if repacked else _k.PLAIN


def matmul(w: np.ndarray, wtype: TypeLike, x: np.ndarray, out: np.ndarray | None = None,
           n_threads: int | None = 1, repacked: bool = True, rows16: bool = False) -> np.ndarray:
    """``out`` [n_tok, n_rows] = ``x`` [n_tok, n_in] times the weight matrix ``w`` [n_rows, n_in].

    Every output rounds exactly as in llama.cpp's CPU backend (x86 AVX2 build), which picks its
    kernel by the shape: ``ggml_vec_dot``, llamafile's sgemm, the tiled K-quant GEMM, or for Q4_0
    and Q4_K weights with rows % 8 == 0 its repacked GEMV/GEMM.

    Parameters
    ----------
    w : numpy.ndarray
        uint8 [n_rows, row_bytes(n_in)] blocks of ``wtype``, or for F32/F16/BF16 a typed
        [n_rows, n_in] array (float32, float16, uint16 bits). C-contiguous.
    wtype : str or GGMLType
    x : numpy.ndarray of float32, shape (n_tok, n_in), C-contiguous
    out : numpy.ndarray of float32, shape (n_tok, n_rows), optional
    n_threads : int or None
        OpenMP threads (None: the usable cores); never more than there are row chunks.
    repacked : bool
        ``w`` is a model weight that llama.cpp keeps in its repacked layout (any matmul weight);
        False for a matrix llama.cpp holds in its plain CPU buffer (one it never multiplies).
    rows16 : bool
        ``w`` is in the rows-16 layout (:func:`to_rows16`; :data:`ROWS16_TYPES` with a multiple of
        16 rows), as a loaded model holds those weights. The same floats as the file's layout.

    Returns
    -------
    numpy.ndarray of float32, shape (n_tok, n_rows)
    """
    fmt = get(wtype)
    fmt._partner()
    wb, n_in = _weight_bytes(w, fmt)
    x = _float_rows(x, "x", require_2d=True, copy=False)
    if x.shape[1] != n_in:
        raise ValueError(f"x has {x.shape[1]} columns, the weight rows {n_in}")
    out = _out_matrix(out, x.shape[0], wb.shape[0])
    _k.matmul(int(fmt.type), wb, n_in, x, out, resolve_n_threads(n_threads), _storage(fmt, repacked, rows16))
    return out


def matmul_quantized(w: np.ndarray, wtype: TypeLike, xq: np.ndarray, out: np.ndarray | None = None,
                     n_threads: int | None = 1, repacked: bool = True, rows16: bool = False) -> np.ndarray:
    """:func:`matmul` from activations already quantized by :func:`quantize_rows_for_dot`."""
    fmt = get(wtype)
    fmt._partner()
    wb, n_in = _weight_bytes(w, fmt)
    xq = _byte_rows(xq, "xq")
    out = _out_matrix(out, xq.shape[0], wb.shape[0])
    _k.matmul_quantized(int(fmt.type), wb, n_in, xq, out, resolve_n_threads(n_threads),
                        _storage(fmt, repacked, rows16))
    return out


# The rows-16 layout (src/quants_rows16.h): the matmul weights of these types, in groups of 16 rows,
# each group block after block with the block's 16 rows interleaved, so that a group is one stream
# of the vectors the repacked-recipe kernels compute with. A loaded model holds them so (where the
# rows are a multiple of 16); the floats are those of the file's layout.
ROWS16_TYPES = frozenset({GGMLType.Q4_0, GGMLType.IQ4_NL, GGMLType.MXFP4})
ROWS16: int = _k.ROWS16  # rows of a group


def matmul_storage(wtype: TypeLike, repacked: bool = True, rows16: bool = False) -> int:
    """The kernels' ``repacked`` value (the plan's matmul nodes take it) for a weight held so."""
    return _storage(get(wtype), repacked, rows16)


def to_rows16(w: np.ndarray, wtype: TypeLike, out: np.ndarray | None = None,
              n_threads: int | None = 1) -> np.ndarray:
    """``w`` (uint8 [n_rows, row_bytes], n_rows a multiple of 16) in the rows-16 layout; ``out`` may
    be ``w`` itself (converted in place, on one thread)."""
    return _rows16(w, wtype, out, True, n_threads)


def from_rows16(w: np.ndarray, wtype: TypeLike, out: np.ndarray | None = None,
                n_threads: int | None = 1) -> np.ndarray:
    """The inverse of :func:`to_rows16`: rows in the file's layout again."""
    return _rows16(w, wtype, out, False, n_threads)


def _rows16(w: np.ndarray, wtype: TypeLike, out: np.ndarray | None, to_rows16: bool,
            n_threads: int | None) -> np.ndarray:
    fmt = get(wtype)
    wb = _byte_rows(w, "w")
    if out is None:
        out = np.empty_like(wb)
    _k.rows16_convert(int(fmt.type), wb, out, to_rows16, resolve_n_threads(n_threads))
    return out


# Types whose matmul weights a loaded model holds as another type's blocks: the same values, the
# same outputs from the kernels (bit for bit), a faster decoding (src/quants_tq_held.h: TQ1_0's
# base-3 bytes as TQ2_0's 2-bit fields, 22% more bytes).
# Each such type: the type it is held as, and the kernel that rewrites its rows so.
_HOLDERS = {GGMLType.TQ1_0: (GGMLType.TQ2_0, _k.tq1_as_tq2)}
HELD_AS: Mapping[GGMLType, GGMLType] = MappingProxyType({t: held for t, (held, _) in _HOLDERS.items()})


def hold_as(w: np.ndarray, wtype: TypeLike, n_threads: int | None = 1) -> np.ndarray:
    """The rows of ``w`` (uint8 [n_rows, row_bytes] of type ``wtype``, a key of :data:`HELD_AS`)
    rewritten in ``HELD_AS[wtype]``'s blocks."""
    fmt = get(wtype)
    if fmt.type not in _HOLDERS:
        raise ValueError(f"{fmt.name} weights are held as they are")
    held, convert = _HOLDERS[fmt.type]
    wb = _byte_rows(w, "w")
    out = np.empty((wb.shape[0], wb.shape[1] // fmt.type_size * get(held).type_size), np.uint8)
    convert(wb, out, resolve_n_threads(n_threads))
    return out


def get_rows(w: np.ndarray, wtype: TypeLike, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of the weight matrix ``w`` dequantized (an embedding lookup): [len(ids), n_in]."""
    fmt = get(wtype)
    wb, n_in = _weight_bytes(w, fmt)
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise TypeError(f"ids must be a 1-D integer array, got {ids.dtype} with shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= wb.shape[0]):
        raise IndexError(f"row ids must lie in [0, {wb.shape[0]}), got {ids.min()}..{ids.max()}")
    out = np.empty((ids.shape[0], n_in), dtype=np.float32)
    _k.get_rows(int(fmt.type), wb, n_in, np.ascontiguousarray(ids, dtype=np.int32), out)
    return out


# ---- argument checking ----

def _float_rows(x: np.ndarray, what: str, require_2d: bool = False, copy: bool = True) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        if not copy or x.dtype.kind not in "fiu":
            raise TypeError(f"{what} must be float32, got {x.dtype}")
        x = x.astype(np.float32)
    if x.ndim not in ((2,) if require_2d else (1, 2)):
        raise ValueError(f"{what} must be {'2-D' if require_2d else '1-D or 2-D'}, got shape {x.shape}")
    if not x.flags.c_contiguous:
        if not copy:
            raise ValueError(f"{what} must be C-contiguous")
        x = np.ascontiguousarray(x)
    return x.reshape(1, -1) if x.ndim == 1 else x


def _is_2d_blob(blob: np.ndarray) -> bool:
    return np.ndim(blob) == 2


def _byte_rows(blob: np.ndarray, what: str) -> np.ndarray:
    blob = np.asarray(blob)
    if blob.ndim not in (1, 2):
        raise ValueError(f"{what} must be 1-D or 2-D, got shape {blob.shape}")
    if not blob.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    rows = blob.reshape(1, -1) if blob.ndim == 1 else blob
    return rows.view(np.uint8) if rows.dtype != np.uint8 else rows


def _weight_bytes(w: np.ndarray, fmt: Format) -> tuple[np.ndarray, int]:
    """``w`` as uint8 rows plus the elements per row."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"w must be 2-D [n_rows, ...], got shape {w.shape}")
    if not w.flags.c_contiguous:
        raise ValueError("w must be C-contiguous")
    if w.dtype == np.uint8:
        if w.shape[1] % fmt.type_size:
            raise ValueError(f"{fmt.name} weight rows are whole blocks of {fmt.type_size} bytes, got {w.shape[1]}")
        return w, w.shape[1] // fmt.type_size * fmt.block_size
    if _TYPED_WEIGHTS.get(fmt.type) == w.dtype:
        return w.view(np.uint8), w.shape[1]
    raise TypeError(f"{fmt.name} weights must be uint8 blocks"
                    + (f" or {_TYPED_WEIGHTS[fmt.type]}" if fmt.type in _TYPED_WEIGHTS else "") + f", got {w.dtype}")


def _out_matrix(out: np.ndarray | None, n_tok: int, n_rows: int) -> np.ndarray:
    if out is None:
        return np.empty((n_tok, n_rows), dtype=np.float32)
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        raise TypeError("out must be a float32 numpy array")
    if out.shape != (n_tok, n_rows) or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous with shape {(n_tok, n_rows)}, got {out.shape}")
    return out
