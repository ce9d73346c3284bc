"""Python entry points of the quantization kernels (``gguflm._ext.quants``).

Thin wrappers: each checks its arguments, then calls a nogil C kernel from ``quants_kernels.h``.
The public, friendlier API is :mod:`gguflm.quants`. The kernels run the ISA of the one switch,
:mod:`gguflm.system`, read when each call starts.
"""

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

from dispatch cimport bind_dispatch, dispatch_names, gguflm_dispatch
from quants_kernels cimport *

cdef const gguflm_dispatch *_switch = bind_dispatch()


def dispatch() -> dict:
    """The ISA and arithmetic this module's kernels would run now, read through its binding."""
    return dispatch_names(_switch)


cdef int _known(int t):
    return 0 <= t < GGUFLM_TYPE_COUNT and gguflm_type_known(t)


cdef int _check_type(int t) except -1:
    if not _known(t):
        raise ValueError(f"ggml type {t} is not handled by the quantization kernels")
    return 0


cdef int _check_dot_type(int t) except -1:
    _check_type(t)
    if gguflm_traits[t].vec_dot_type < 0:
        raise ValueError(f"{gguflm_traits[t].name.decode()} has no dot kernel (it is an activation format)")
    return 0


cdef int64_t _row_bytes(int t, int64_t n) except -1:
    cdef int64_t rb = gguflm_row_bytes(t, n)
    if rb < 0:
        raise ValueError(
            f"{gguflm_traits[t].name.decode()} rows need a multiple of {gguflm_traits[t].block_size} "
            f"elements, got {n}")
    return rb


cdef int _check_threads(int n_threads) except -1:
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    return 0


def type_traits(int type) -> dict | None:
    """``{"name", "block_size", "type_size", "vec_dot_type"}`` of a ggml type id, or None."""
    if not _known(type):
        return None
    t = gguflm_traits[type]
    return {"name": t.name.decode(), "block_size": t.block_size, "type_size": t.type_size,
            "vec_dot_type": t.vec_dot_type if t.vec_dot_type >= 0 else None}


def row_bytes(int type, int64_t n) -> int:
    """Bytes of ``n`` elements of ``type``; ValueError unless ``n`` is a whole number of blocks."""
    _check_type(type)
    return _row_bytes(type, n)


def act_buffer_bytes(int vec_dot_type, int64_t n_tok, int64_t n_in) -> int:
    """Scratch bytes for ``n_tok`` activation rows of ``n_in`` elements in ``vec_dot_type``."""
    _check_type(vec_dot_type)
    if n_tok < 0:
        raise ValueError(f"n_tok must be >= 0, got {n_tok}")
    return _row_bytes(vec_dot_type, n_in) * n_tok


def quantize(int type, const float[:, ::1] x, uint8_t[:, ::1] out, bint activation=False):
    """Quantize rows ``x`` [n, k] into ``out`` [n, row_bytes(type, k)] with ggml's reference
    quantizer, or with the activation quantizer (ggml's CPU ``from_float``) when ``activation``."""
    _check_type(type)
    cdef int64_t n = x.shape[0], k = x.shape[1], i
    cdef int64_t rb = _row_bytes(type, k)
    if out.shape[0] != n or out.shape[1] != rb:
        raise ValueError(f"out must be [{n}, {rb}], got [{out.shape[0]}, {out.shape[1]}]")
    cdef gguflm_from_float_fn fn = gguflm_from_float(_switch.isa, type, activation)
    if fn == NULL:
        if gguflm_quantize_weighted(type) != NULL:
            raise ValueError(f"{gguflm_traits[type].name.decode()} quantization needs an importance matrix (imatrix), "
                             "as ggml's does")
        raise ValueError(f"quantizing to {gguflm_traits[type].name.decode()} is not implemented")
    if n == 0 or k == 0:
        return
    with nogil:
        for i in range(n):
            fn(&x[i, 0], &out[i, 0], k)


def quantize_weighted(int type, const float[:, ::1] x, uint8_t[:, ::1] out, const float[::1] qw):
    """Quantize rows ``x`` [n, k] into ``out`` as ggml_quantize_chunk does with the importance
    weights ``qw`` [k] (one per column; types whose ggml quantizer ignores them: the reference)."""
    _check_type(type)
    cdef int64_t n = x.shape[0], k = x.shape[1], i
    cdef int64_t rb = _row_bytes(type, k)
    if out.shape[0] != n or out.shape[1] != rb:
        raise ValueError(f"out must be [{n}, {rb}], got [{out.shape[0]}, {out.shape[1]}]")
    if qw.shape[0] != k:
        raise ValueError(f"the importance weights must be one per column ({k}), got {qw.shape[0]}")
    cdef gguflm_quantize_w_fn fn = gguflm_quantize_weighted(type)
    cdef gguflm_from_float_fn ref = gguflm_from_float(_switch.isa, type, 0)
    if n == 0 or k == 0:
        return
    with nogil:
        for i in range(n):
            if fn != NULL:
                fn(&x[i, 0], &out[i, 0], k, &qw[0])
            else:
                ref(&x[i, 0], &out[i, 0], k)


def dequantize(int type, const uint8_t[:, ::1] blob, float[:, ::1] out):
    """Dequantize rows ``blob`` [n, row_bytes(type, k)] into ``out`` [n, k]."""
    _check_type(type)
    cdef int64_t n = out.shape[0], k = out.shape[1], i
    cdef int64_t rb = _row_bytes(type, k)
    if blob.shape[0] != n or blob.shape[1] != rb:
        raise ValueError(f"blob must be [{n}, {rb}] for {k} elements per row, got [{blob.shape[0]}, {blob.shape[1]}]")
    if n == 0 or k == 0:
        return
    cdef gguflm_to_float_fn fn = gguflm_to_float(_switch.isa, type)
    with nogil:
        for i in range(n):
            fn(&blob[i, 0], &out[i, 0], k)


def vec_dot(int wtype, const uint8_t[::1] w, const uint8_t[::1] xq, int64_t n) -> float:
    """Dot of one weight row (``n`` elements of ``wtype``) with one activation row already in
    ``wtype``'s vec_dot partner type: ggml's ``ggml_vec_dot`` in the current arithmetic, current ISA's
    kernel."""
    _check_dot_type(wtype)
    cdef int64_t wb = _row_bytes(wtype, n)
    cdef int64_t xb = _row_bytes(gguflm_traits[wtype].vec_dot_type, n)
    if w.shape[0] != wb or xq.shape[0] != xb:
        raise ValueError(f"expected {wb} weight bytes and {xb} activation bytes, got {w.shape[0]} and {xq.shape[0]}")
    cdef float s = 0.0
    if n == 0:
        return 0.0
    cdef gguflm_gemm_fn dot = gguflm_kernel(_switch.isa, GGUFLM_PATH_DOT, wtype)
    cdef int arith = _switch.arith
    with nogil:
        dot(n, &w[0], 0, 1, &xq[0], 0, 1, &s, 0, arith)
    return s


def quantize_act(int vec_dot_type, const float[:, ::1] x, uint8_t[:, ::1] out, int n_threads=1):
    """Quantize activations ``x`` [n_tok, n_in] into ``out`` [n_tok, row_bytes] on ``n_threads``."""
    _check_type(vec_dot_type)
    _check_threads(n_threads)
    cdef int64_t n_tok = x.shape[0], n_in = x.shape[1]
    cdef int64_t rb = _row_bytes(vec_dot_type, n_in)
    if out.shape[0] != n_tok or out.shape[1] != rb:
        raise ValueError(f"out must be [{n_tok}, {rb}], got [{out.shape[0]}, {out.shape[1]}]")
    if n_tok == 0 or n_in == 0:
        return
    cdef int isa = _switch.isa
    with nogil:
        gguflm_quantize_act(vec_dot_type, &x[0, 0], n_in, n_tok, n_in, &out[0, 0], isa, n_threads)


cdef int _check_matmul(int wtype, const uint8_t[:, ::1] w, int64_t n_in, int64_t n_tok, float[:, ::1] out,
                       int n_threads) except -1:
    """Raises on bad arguments; returns 0 when there is nothing to compute (out is then done)."""
    _check_dot_type(wtype)
    _check_threads(n_threads)
    cdef int64_t rb = _row_bytes(wtype, n_in)
    if w.shape[1] != rb:
        raise ValueError(f"weight rows of {n_in} {gguflm_traits[wtype].name.decode()} elements take {rb} bytes, "
                         f"got {w.shape[1]}")
    if out.shape[0] != n_tok or out.shape[1] != w.shape[0]:
        raise ValueError(f"out must be [{n_tok}, {w.shape[0]}], got [{out.shape[0]}, {out.shape[1]}]")
    if w.shape[0] == 0 or n_tok == 0:
        return 0
    if n_in == 0:
        out[:, :] = 0
        return 0
    return 1


# how a matmul weight is held (the ``repacked`` argument of matmul and matmul_quantized)
PLAIN = GGUFLM_PLAIN                    # llama.cpp's plain CPU buffer (a tied token embedding)
REPACKED = GGUFLM_REPACKED              # where llama.cpp repacks it; here the file's layout
REPACKED_ROWS16 = GGUFLM_REPACKED_ROWS16  # the same, held in the rows-16 layout (rows16_convert)
ROWS16 = GGUFLM_ROWS16                  # rows per group of that layout
STREAM_BYTES = GGUFLM_STREAM_BYTES      # a single token's legacy-block matrix this large streams row by row


cdef int _check_repacked(int wtype, int64_t n_rows, int repacked) except -1:
    if repacked not in (GGUFLM_PLAIN, GGUFLM_REPACKED, GGUFLM_REPACKED_ROWS16):
        raise ValueError(f"repacked must be PLAIN, REPACKED or REPACKED_ROWS16, got {repacked}")
    if repacked == GGUFLM_REPACKED_ROWS16:
        _check_rows16(wtype, n_rows)
    return 0


cdef int _check_rows16(int wtype, int64_t n_rows) except -1:
    _check_type(wtype)
    if not gguflm_rows16_type(wtype):
        raise ValueError(f"{gguflm_traits[wtype].name.decode()} has no rows-16 layout")
    if n_rows % GGUFLM_ROWS16:
        raise ValueError(f"the rows-16 layout takes a multiple of {GGUFLM_ROWS16} rows, got {n_rows}")
    return 0


def rows16_convert(int wtype, const uint8_t[:, ::1] src, uint8_t[:, ::1] dst, bint to_rows16, int n_threads=1):
    """``dst`` = the rows of ``src`` (file layout) in the rows-16 layout (``to_rows16``), or back;
    ``dst`` may be ``src`` (then one thread converts)."""
    _check_rows16(wtype, src.shape[0])
    _check_threads(n_threads)
    if dst.shape[0] != src.shape[0] or dst.shape[1] != src.shape[1]:
        raise ValueError(f"dst must be [{src.shape[0]}, {src.shape[1]}], got [{dst.shape[0]}, {dst.shape[1]}]")
    if src.shape[1] % gguflm_traits[wtype].type_size:
        raise ValueError(f"rows of {src.shape[1]} bytes are not whole {gguflm_traits[wtype].name.decode()} blocks")
    if src.shape[0] == 0 or src.shape[1] == 0:
        return
    tmp = np.empty(GGUFLM_ROWS16 * src.shape[1], dtype=np.uint8)
    cdef uint8_t[::1] tv = tmp
    with nogil:
        gguflm_rows16_convert(wtype, to_rows16, &src[0, 0], &dst[0, 0], src.shape[0], src.shape[1], &tv[0],
                              n_threads)


def tq1_as_tq2(const uint8_t[:, ::1] src, uint8_t[:, ::1] dst, int n_threads=1):
    """``dst`` = the TQ1_0 rows of ``src`` with each block rewritten as a TQ2_0 block (the same
    values and scale), ``dst`` [rows, blocks x 66] for ``src`` [rows, blocks x 54]."""
    _check_threads(n_threads)
    cdef int64_t tq1 = gguflm_traits[GGUFLM_TQ1_0].type_size, tq2 = gguflm_traits[GGUFLM_TQ2_0].type_size
    if src.shape[1] % tq1:
        raise ValueError(f"rows of {src.shape[1]} bytes are not whole TQ1_0 blocks")
    if dst.shape[0] != src.shape[0] or dst.shape[1] != src.shape[1] // tq1 * tq2:
        raise ValueError(f"dst must be [{src.shape[0]}, {src.shape[1] // tq1 * tq2}], got [{dst.shape[0]}, {dst.shape[1]}]")
    if src.shape[0] == 0 or src.shape[1] == 0:
        return
    with nogil:
        gguflm_tq1_as_tq2(&src[0, 0], &dst[0, 0], src.shape[0] * (src.shape[1] // tq1), n_threads)


def matmul(int wtype, const uint8_t[:, ::1] w, int64_t n_in, const float[:, ::1] x, float[:, ::1] out,
           int n_threads=1, int repacked=GGUFLM_REPACKED):
    """``out`` [n_tok, n_rows] = ``w`` [n_rows, row_bytes] . ``x`` [n_tok, n_in]; the activations
    are quantized to the partner type inside the same parallel region. Each output is computed
    with the arithmetic llama.cpp's CPU backend uses for this shape; ``repacked``: how ``w`` is held
    (PLAIN: in llama.cpp's plain CPU buffer; REPACKED: where llama.cpp repacks it; REPACKED_ROWS16:
    the same, ``w`` in the rows-16 layout)."""
    _check_repacked(wtype, w.shape[0], repacked)
    if x.shape[1] != n_in:
        raise ValueError(f"x must have {n_in} columns, got {x.shape[1]}")
    if not _check_matmul(wtype, w, n_in, x.shape[0], out, n_threads):
        return
    cdef int64_t n_rows = w.shape[0], n_tok = x.shape[0]
    scratch = np.empty(act_buffer_bytes(gguflm_traits[wtype].vec_dot_type, n_tok, n_in), dtype=np.uint8)
    cdef uint8_t[::1] sv = scratch
    cdef int isa = _switch.isa, arith = _switch.arith
    with nogil:
        gguflm_matmul_f32(wtype, &w[0, 0], w.shape[1], n_rows, n_in, &x[0, 0], n_in, n_tok, &sv[0],
                          &out[0, 0], n_rows, repacked, isa, arith, n_threads)


def matmul_quantized(int wtype, const uint8_t[:, ::1] w, int64_t n_in, const uint8_t[:, ::1] xq,
                     float[:, ::1] out, int n_threads=1, int repacked=GGUFLM_REPACKED):
    """``out`` = ``w`` . activations already quantized (``xq`` [n_tok, act row bytes]); see
    :func:`matmul` for ``repacked``."""
    _check_dot_type(wtype)
    _check_repacked(wtype, w.shape[0], repacked)
    cdef int64_t xb = _row_bytes(gguflm_traits[wtype].vec_dot_type, n_in)
    if xq.shape[1] != xb:
        raise ValueError(f"xq rows must take {xb} bytes, got {xq.shape[1]}")
    if not _check_matmul(wtype, w, n_in, xq.shape[0], out, n_threads):
        return
    cdef int64_t n_rows = w.shape[0], n_tok = xq.shape[0]
    cdef int isa = _switch.isa, arith = _switch.arith
    with nogil:
        gguflm_matmul_q(wtype, &w[0, 0], w.shape[1], n_rows, n_in, &xq[0, 0], n_tok, &out[0, 0], n_rows, repacked,
                        isa, arith, n_threads)


def get_rows(int type, const uint8_t[:, ::1] w, int64_t n_in, const int32_t[::1] ids, float[:, ::1] out):
    """``out[i]`` = row ``ids[i]`` of ``w`` dequantized."""
    _check_type(type)
    cdef int64_t rb = _row_bytes(type, n_in), i, n_ids = ids.shape[0]
    if w.shape[1] != rb:
        raise ValueError(f"weight rows must take {rb} bytes, got {w.shape[1]}")
    if out.shape[0] != n_ids or out.shape[1] != n_in:
        raise ValueError(f"out must be [{n_ids}, {n_in}], got [{out.shape[0]}, {out.shape[1]}]")
    for i in range(n_ids):
        if not 0 <= ids[i] < w.shape[0]:
            raise IndexError(f"row id {ids[i]} out of range for {w.shape[0]} rows")
    if n_ids == 0 or n_in == 0:
        return
    cdef int isa = _switch.isa
    with nogil:
        gguflm_get_rows(type, &w[0, 0], rb, n_in, &ids[0], n_ids, &out[0, 0], n_in, isa)


def amx_batch(int wtype, int64_t n_rows, int64_t n_in, int repacked=GGUFLM_REPACKED) -> bool:
    """Whether a batch matmul (16+ tokens) of such a weight takes its integer dots from the AMX
    tiles now (the ISA, the AMX switch and the weight's recipe say)."""
    _check_dot_type(wtype)
    _check_repacked(wtype, n_rows, repacked)
    cdef int64_t w_stride = _row_bytes(wtype, n_in)
    return bool(gguflm_amx_batch(_switch.isa, wtype, n_rows, w_stride, n_in, repacked, _switch.arith))


def int8_peak(int64_t iters, int n_threads=1, bint amx=False) -> int:
    """Run the current ISA's int8 multiply-add peak loop ``iters`` rounds on ``n_threads`` threads
    (amx: the AMX tiles' loop); returns the int8 operations done (2 per multiply-add), 0 for the
    scalar ISA, and with amx where the tiles are off (time the call)."""
    _check_threads(n_threads)
    if iters < 0:
        raise ValueError(f"iters must be >= 0, got {iters}")
    cdef int isa = _switch.isa
    cdef int64_t checksum, ops
    with nogil:
        ops = gguflm_int8_peak(isa, amx, iters, n_threads, &checksum)
    return ops


def read_sum(const uint64_t[::1] buf, int n_threads=1) -> int:
    """Sum of ``buf``'s 64-bit words read on ``n_threads`` threads (a memory read probe)."""
    _check_threads(n_threads)
    cdef uint64_t total
    with nogil:
        total = gguflm_read_sum(&buf[0], buf.shape[0], n_threads)
    return total


cdef extern from "quants_iq_grids.h" nogil:
    const uint8_t gguflm_ksigns_iq2xs[128]
    const uint64_t gguflm_ksigns64[128]
    const uint64_t gguflm_iq2xxs_grid[256]
    const uint64_t gguflm_iq2xs_grid[512]
    const uint64_t gguflm_iq2s_grid[1024]
    const uint32_t gguflm_iq3xxs_grid[256]
    const uint32_t gguflm_iq3s_grid[512]
    const uint64_t gguflm_iq1s_grid[2048]


def iq_grid_tables() -> dict:
    """The grid i-quants' tables as compiled in, by ggml's names: raw bytes of the C arrays
    (little-endian entries), for tests that check them against other sources."""
    return {
        "ksigns_iq2xs": (<const char *>gguflm_ksigns_iq2xs)[:128],
        "ksigns64": (<const char *>gguflm_ksigns64)[:128 * 8],
        "iq2xxs_grid": (<const char *>gguflm_iq2xxs_grid)[:256 * 8],
        "iq2xs_grid": (<const char *>gguflm_iq2xs_grid)[:512 * 8],
        "iq2s_grid": (<const char *>gguflm_iq2s_grid)[:1024 * 8],
        "iq3xxs_grid": (<const char *>gguflm_iq3xxs_grid)[:256 * 4],
        "iq3s_grid": (<const char *>gguflm_iq3s_grid)[:512 * 4],
        "iq1s_grid": (<const char *>gguflm_iq1s_grid)[:2048 * 8],
    }
