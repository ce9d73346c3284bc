"""The state-space kernels of recurrent models (``ssm.h``): Mamba's causal convolution and selective
scans (Mamba-1's, Mamba-2's grouped one) over states held in rows, as ggml-cpu's ``ssm_conv`` and
``ssm_scan`` compute them.

The recorded forward pass calls the C kernels directly (``plan.h``); these ``def`` wrappers check
shapes and run them with the GIL released, for tests and benchmarks. A ubatch's tokens come
sequence after sequence, as many each; ``cells[t]`` is the state row of token t's sequence.
"""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int64_t
from libc.string cimport memset
from dispatch cimport bind_dispatch, gguflm_dispatch
from ssm_kernels cimport gguflm_ssm_args, gguflm_ssm_conv, gguflm_ssm_scan, gguflm_ssm_scan_grouped

cnp.import_array()

cdef const gguflm_dispatch *_switch = bind_dispatch()


cdef int _check_cells(const int64_t[::1] cells, Py_ssize_t n_tokens, Py_ssize_t n_rows) except -1:
    if cells.shape[0] != n_tokens or n_tokens == 0:
        raise ValueError(f"cells has {cells.shape[0]} entries for {n_tokens} tokens (at least one)")
    cdef Py_ssize_t nst = 1
    while nst < n_tokens and cells[nst] == cells[0]:
        nst += 1
    if n_tokens % nst:
        raise ValueError("the tokens must come sequence after sequence, as many each")
    arr = np.asarray(cells)
    if arr.min() < 0 or arr.max() >= n_rows:
        raise ValueError(f"cells must be state rows in [0, {n_rows})")
    starts = arr[::nst]
    if len(np.unique(starts)) != len(starts) or (arr != np.repeat(starts, nst)).any():
        raise ValueError("each sequence's tokens must share one state row, of their own")
    return 0


def check_cells(const int64_t[::1] cells, Py_ssize_t n_tokens, Py_ssize_t n_rows) -> None:
    """Raise ValueError unless ``cells`` gives n_tokens tokens' state rows in [0, n_rows), sequence
    after sequence, as many each, one row per sequence (every recurrent kernel's layout)."""
    _check_cells(cells, n_tokens, n_rows)


def ssm_conv(float[:, ::1] r, const int64_t[::1] cells, const float[:, :] x, const float[:, ::1] conv_w,
             const float[::1] conv_b, float[:, ::1] out, int n_threads=1, bint silu=True):
    """``out = silu(conv1d(state ++ x) + conv_b)`` per sequence (ggml_ssm_conv, add, silu); the
    conv states ``r`` ([n_rows, d_inner * (d_conv - 1)]) move on in place. x: [n_tokens, d_inner]
    (rows may be strided), conv_w: [d_inner, d_conv]; conv_b None: no bias; ``silu`` False: no
    SiLU (LFM2's short convolution)."""
    cdef Py_ssize_t n_tokens = x.shape[0], d_inner = x.shape[1], d_conv = conv_w.shape[1]
    if x.strides[1] != 4:
        raise ValueError("x's rows must be contiguous")
    if conv_w.shape[0] != d_inner or (conv_b is not None and conv_b.shape[0] != d_inner) or d_conv < 1:
        raise ValueError("conv_w must be [d_inner, d_conv] and conv_b [d_inner]")
    if r.shape[1] != d_inner * (d_conv - 1) or out.shape[0] != n_tokens or out.shape[1] != d_inner:
        raise ValueError("r must be [n_rows, d_inner * (d_conv - 1)] and out [n_tokens, d_inner]")
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    _check_cells(cells, n_tokens, r.shape[0])
    cdef gguflm_ssm_args a
    memset(&a, 0, sizeof(a))
    a.r, a.cells, a.n_tokens, a.d_conv, a.d_inner = &r[0, 0] if r.shape[1] else NULL, &cells[0], n_tokens, d_conv, d_inner
    a.x, a.x_stride = &x[0, 0], x.strides[0] // 4
    a.conv_w, a.out, a.out_stride = &conv_w[0, 0], &out[0, 0], d_inner
    a.conv_b, a.conv_linear = &conv_b[0] if conv_b is not None else NULL, not silu
    cdef int isa = _switch.isa, arith = _switch.arith
    with nogil:
        gguflm_ssm_conv(&a, isa, arith, n_threads)


def ssm_scan(float[:, ::1] s, const int64_t[::1] cells, const float[:, ::1] x, const float[:, ::1] dt,
             const float[:, ::1] A, const float[:, :] B, const float[:, :] C, const float[::1] D,
             float[:, ::1] out, int n_threads=1):
    """Mamba-1's selective scan (ggml_ssm_scan, then ``+ x * D``): ``out[t] = y[t] + x[t] * D``;
    the SSM states ``s`` ([n_rows, d_inner * d_state]) move on in place. x, dt: [n_tokens,
    d_inner]; A: [d_inner, d_state]; B, C: [n_tokens, d_state] (rows may be strided)."""
    cdef Py_ssize_t n_tokens = x.shape[0], d_inner = x.shape[1], d_state = A.shape[1]
    if dt.shape[0] != n_tokens or dt.shape[1] != d_inner or A.shape[0] != d_inner or D.shape[0] != d_inner:
        raise ValueError("dt must be [n_tokens, d_inner], A [d_inner, d_state], D [d_inner]")
    if B.shape[0] != n_tokens or C.shape[0] != n_tokens or B.shape[1] != d_state or C.shape[1] != d_state \
            or B.strides[1] != 4 or C.strides[1] != 4 or B.strides[0] != C.strides[0]:
        raise ValueError("B and C must be [n_tokens, d_state] with contiguous rows, one stride")
    if s.shape[1] != d_inner * d_state or out.shape[0] != n_tokens or out.shape[1] != d_inner:
        raise ValueError("s must be [n_rows, d_inner * d_state] and out [n_tokens, d_inner]")
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    _check_cells(cells, n_tokens, s.shape[0])
    cdef gguflm_ssm_args a
    memset(&a, 0, sizeof(a))
    a.s, a.cells, a.n_tokens, a.d_inner, a.d_state = &s[0, 0], &cells[0], n_tokens, d_inner, d_state
    a.x, a.x_stride, a.dt, a.dt_stride = &x[0, 0], d_inner, &dt[0, 0], d_inner
    a.A, a.D, a.B, a.C, a.bc_stride = &A[0, 0], &D[0], &B[0, 0], &C[0, 0], B.strides[0] // 4
    a.out, a.out_stride = &out[0, 0], d_inner
    cdef int isa = _switch.isa
    with nogil:
        gguflm_ssm_scan(&a, isa, n_threads)


def ssm_scan_grouped(float[:, ::1] s, const int64_t[::1] cells, const float[:, :] x, const float[:, :] dt,
                     const float[::1] dt_b, const float[::1] A, const float[:, :] B, const float[:, :] C,
                     const float[::1] D, int n_group, float[:, ::1] out, int n_threads=1):
    """Mamba-2's selective scan (ggml_ssm_scan with one decay per head, then + x * D): n_head =
    len(A) heads of d_inner / n_head channels, B and C [n_tokens, n_group * d_state] for groups of
    heads; dt [n_tokens, n_head] before its bias dt_b. The SSM states ``s`` ([n_rows, d_inner *
    d_state]) move on in place. Rows of x, dt, B and C may be strided."""
    cdef Py_ssize_t n_tokens = x.shape[0], d_inner = x.shape[1], n_head = A.shape[0]
    if n_head < 1 or n_group < 1 or d_inner % n_head or n_head % n_group:
        raise ValueError("d_inner must be a multiple of n_head, n_head of n_group")
    if B.shape[1] % n_group:
        raise ValueError("B's rows must hold n_group * d_state values")
    cdef Py_ssize_t d_state = B.shape[1] // n_group
    if dt.shape[0] != n_tokens or dt.shape[1] != n_head or dt_b.shape[0] != n_head or D.shape[0] != n_head:
        raise ValueError("dt must be [n_tokens, n_head], dt_b and D [n_head]")
    if B.shape[0] != n_tokens or C.shape[0] != n_tokens or C.shape[1] != B.shape[1] or B.strides[1] != 4 \
            or C.strides[1] != 4 or B.strides[0] != C.strides[0] or x.strides[1] != 4 or dt.strides[1] != 4:
        raise ValueError("B and C must be [n_tokens, n_group * d_state] with contiguous rows, one stride")
    if d_state < 1 or s.shape[1] != d_inner * d_state or out.shape[0] != n_tokens or out.shape[1] != d_inner:
        raise ValueError("s must be [n_rows, d_inner * d_state] and out [n_tokens, d_inner]")
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    _check_cells(cells, n_tokens, s.shape[0])
    cdef gguflm_ssm_args a
    memset(&a, 0, sizeof(a))
    a.s, a.cells, a.n_tokens, a.d_inner, a.d_state = &s[0, 0], &cells[0], n_tokens, d_inner, d_state
    a.x, a.x_stride, a.dt, a.dt_stride, a.dt_b = &x[0, 0], x.strides[0] // 4, &dt[0, 0], dt.strides[0] // 4, &dt_b[0]
    a.A, a.D, a.B, a.C, a.bc_stride = &A[0], &D[0], &B[0, 0], &C[0, 0], B.strides[0] // 4
    a.n_head, a.n_group, a.out, a.out_stride = n_head, n_group, &out[0, 0], d_inner
    cdef int isa = _switch.isa, arith = _switch.arith
    with nogil:
        gguflm_ssm_scan_grouped(&a, isa, arith, n_threads)
