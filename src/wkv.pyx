"""RWKV's kernels (``wkv.h``): the WKV recurrences of RWKV-6 and RWKV-7 over states held in rows,
as ggml-cpu's ``rwkv_wkv6`` and ``rwkv_wkv7`` compute them, and the token shift and element-wise
steps of RWKV's graphs.

The recorded forward pass calls the C kernels directly (``plan.h``); these ``def`` wrappers check
shapes and run them with the GIL released, for tests and benchmarks. A ubatch's tokens come
sequence after sequence, as many each; ``cells[t]`` is the state row of token t's sequence.
"""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int64_t
from libc.string cimport memset
from dispatch cimport bind_dispatch, gguflm_dispatch
from wkv_kernels cimport *

cnp.import_array()

cdef const gguflm_dispatch *_switch = bind_dispatch()

# the kinds of wkv.h, as graph.py records them (Plan.wkv)
KINDS = {"wkv6": GGUFLM_WKV6, "wkv7": GGUFLM_WKV7, "shift": GGUFLM_WKV_SHIFT, "lerp": GGUFLM_WKV_LERP,
         "decay6": GGUFLM_WKV_DECAY6, "decay7": GGUFLM_WKV_DECAY7, "sigmoid": GGUFLM_WKV_SIGMOID,
         "relu_sqr": GGUFLM_WKV_RELU_SQR, "sigmoid_mul": GGUFLM_WKV_SIGMOID_MUL, "mul": GGUFLM_WKV_MUL,
         "value_mix": GGUFLM_WKV_VALUE_MIX, "key_decay": GGUFLM_WKV_KEY_DECAY, "wkv7_keys": GGUFLM_WKV7_KEYS,
         "wkv7_bonus": GGUFLM_WKV7_BONUS, "gla": GGUFLM_WKV_GLA, "repeat": GGUFLM_WKV_REPEAT}

# the largest step of RWKV-7's vector loops (4 vectors of 16 floats): head sizes must be multiples
WKV7_HEAD_MULTIPLE = 64


def check_cells(cells: np.ndarray, n_tokens: int, n_rows: int) -> None:
    """Raise ValueError unless ``cells`` gives n_tokens tokens, sequence after sequence and as
    many each, one state row of their own per sequence, in [0, n_rows)."""
    cells = np.asarray(cells)
    if cells.shape != (n_tokens,) or n_tokens == 0:
        raise ValueError(f"cells has {cells.shape[0]} entries for {n_tokens} tokens (at least one)")
    nst = int(np.argmax(cells != cells[0])) or n_tokens
    if n_tokens % nst:
        raise ValueError("the tokens must come sequence after sequence, as many each")
    if cells.min() < 0 or cells.max() >= n_rows:
        raise ValueError(f"cells must be state rows in [0, {n_rows})")
    starts = cells[::nst]
    if len(np.unique(starts)) != len(starts) or (cells != np.repeat(starts, nst)).any():
        raise ValueError("each sequence's tokens must share one state row, of their own")


cdef void _set_inputs(gguflm_wkv_args *a, tuple xs) except *:
    cdef int i
    cdef const float[:, ::1] x
    for i in range(len(xs)):
        x = xs[i]
        if x.shape[0] != a.n_tokens or x.shape[1] != a.n:
            raise ValueError(f"input {i} must be [n_tokens, {a.n}]")
        a.x[i], a.x_stride[i] = &x[0, 0], a.n


def _wkv(int kind, float[:, ::1] state, const int64_t[::1] cells, int64_t head_size, tuple xs,
         const float[::1] u, float[:, ::1] out, int n_threads, float scale=0.0):
    cdef Py_ssize_t n_tokens = out.shape[0], n = out.shape[1]
    if head_size < 1 or n % head_size:
        raise ValueError(f"the rows ({n}) must be whole heads of {head_size}")
    if state.shape[1] != n * head_size:
        raise ValueError("state must be [n_rows, n * head_size]")
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    check_cells(np.asarray(cells), n_tokens, state.shape[0])
    cdef gguflm_wkv_args a
    memset(&a, 0, sizeof(a))
    a.kind, a.n_tokens, a.n, a.head_size, a.scale = kind, n_tokens, n, head_size, scale
    a.state, a.cells = &state[0, 0], &cells[0]
    _set_inputs(&a, xs)
    if u is not None:
        if u.shape[0] != n:
            raise ValueError(f"u must hold {n} values")
        a.p[0] = &u[0]
    a.out[0], a.out_stride[0] = &out[0, 0], n
    cdef int arith = _switch.arith
    with nogil:
        gguflm_wkv_run(&a, arith, n_threads)


def wkv6(float[:, ::1] state, const int64_t[::1] cells, int64_t head_size, k, v, r, const float[::1] u, w,
         float[:, ::1] out, int n_threads=1):
    """RWKV-6's WKV (ggml_rwkv_wkv6): k, v, r, w (the decays) [n_tokens, n], u (time_first) [n];
    heads of ``head_size``; the states ``state`` ([n_rows, n * head_size]) of the tokens' rows
    move on in place; out [n_tokens, n]."""
    _wkv(GGUFLM_WKV6, state, cells, head_size, (k, v, r, w), u, out, n_threads)


def wkv7(float[:, ::1] state, const int64_t[::1] cells, int64_t head_size, r, w, k, v, a, b,
         float[:, ::1] out, int n_threads=1):
    """RWKV-7's WKV (ggml_rwkv_wkv7): r, w, k, v, a, b [n_tokens, n] in heads of ``head_size`` (a
    multiple of WKV7_HEAD_MULTIPLE); the states move on in place; out [n_tokens, n]."""
    if head_size % (4 * gguflm_vec_lanes(_switch.arith)):
        raise ValueError(f"head_size {head_size} must be a multiple of {WKV7_HEAD_MULTIPLE}")
    _wkv(GGUFLM_WKV7, state, cells, head_size, (r, w, k, v, a, b), None, out, n_threads)


def gla(float[:, ::1] state, const int64_t[::1] cells, int64_t head_size, k, v, q, g, float scale,
        float[:, ::1] out, int n_threads=1):
    """Gated linear attention (ggml_gated_linear_attn, QRWKV-6's WKV): k, v, q, g (the decays)
    [n_tokens, n] in heads of ``head_size``, q scaled by ``scale``; the states move on in place."""
    _wkv(GGUFLM_WKV_GLA, state, cells, head_size, (k, v, q, g), None, out, n_threads, scale)
