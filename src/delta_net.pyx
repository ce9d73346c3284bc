"""The gated delta-net of Qwen3-Next / Qwen3.5 (``delta_net.h``), as ggml-cpu's
``gated_delta_net`` computes it, over states held in the recurrent memory's rows.

The recorded forward pass calls the C kernel directly (``plan.h``); this ``def`` wrapper checks
shapes and runs it with the GIL released, for tests and benchmarks. A ubatch's tokens come
sequence after sequence, as many each; ``cells[t]`` is the state row of token t's sequence.
"""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int64_t
from libc.string cimport memset
from dispatch cimport bind_dispatch, gguflm_dispatch
from delta_net_kernels cimport gguflm_gdn_args, gguflm_gated_delta_net

from gguflm._ext.ssm import check_cells

cnp.import_array()

cdef const gguflm_dispatch *_switch = bind_dispatch()


def gated_delta_net(float[:, ::1] s, const int64_t[::1] cells, const float[:, :] q, const float[:, :] k,
                    const float[:, :] v, const float[:, :] g, const float[:, :] beta, float[:, ::1] out,
                    int n_threads=1):
    """One gated delta-net step per token: per value head, ``S = S * exp(g)``, ``delta = (v -
    S^T k) * beta``, ``S += k delta^T``, ``out = S^T q / sqrt(d)``; the states ``s`` ([n_rows,
    n_head_v * d * d], each head's block transposed as ggml's) move on in place. q, k: [n_tokens,
    n_head_k * d]; v, out: [n_tokens, n_head_v * d]; g, beta: [n_tokens, n_head_v] (rows may be
    strided). Value head h reads key head h % n_head_k."""
    cdef Py_ssize_t n_tokens = v.shape[0], n_head_v = g.shape[1]
    if n_head_v < 1 or v.shape[1] % n_head_v:
        raise ValueError("v's rows must hold n_head_v heads of d values")
    cdef Py_ssize_t d = v.shape[1] // n_head_v
    if d < 1 or q.shape[1] != k.shape[1] or q.shape[1] % d or q.shape[1] == 0 or n_head_v % (q.shape[1] // d):
        raise ValueError("q and k must hold n_head_k heads of d values, n_head_k dividing n_head_v")
    if q.shape[0] != n_tokens or k.shape[0] != n_tokens or g.shape[0] != n_tokens or beta.shape[0] != n_tokens \
            or beta.shape[1] != n_head_v or out.shape[0] != n_tokens or out.shape[1] != v.shape[1]:
        raise ValueError("q, k, g, beta and out must have one row per token of v; beta [n, n_head_v]")
    if q.strides[1] != 4 or k.strides[1] != 4 or v.strides[1] != 4 or g.strides[1] != 4 or beta.strides[1] != 4:
        raise ValueError("the rows of q, k, v, g and beta must be contiguous")
    if s.shape[1] != n_head_v * d * d:
        raise ValueError("s must be [n_rows, n_head_v * d * d]")
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    check_cells(cells, n_tokens, s.shape[0])
    cdef gguflm_gdn_args a
    memset(&a, 0, sizeof(a))
    a.s, a.cells, a.n_tokens, a.d = &s[0, 0], &cells[0], n_tokens, d
    a.n_head_k, a.n_head_v = q.shape[1] // d, n_head_v
    a.q, a.q_stride, a.k, a.k_stride = &q[0, 0], q.strides[0] // 4, &k[0, 0], k.strides[0] // 4
    a.v, a.v_stride = &v[0, 0], v.strides[0] // 4
    a.g, a.g_stride, a.beta, a.beta_stride = &g[0, 0], g.strides[0] // 4, &beta[0, 0], beta.strides[0] // 4
    a.out, a.out_stride = &out[0, 0], out.shape[1]
    cdef int isa = _switch.isa, arith = _switch.arith
    with nogil:
        gguflm_gated_delta_net(&a, isa, arith, n_threads)

