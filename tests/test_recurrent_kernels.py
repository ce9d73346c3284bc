"""The state-space kernels (src/ssm.h) against ggml-cpu's own ssm_conv and ssm_scan.

ggml (the libraries llama-cpp-python ships) computes a one-graph oracle: ``ggml_ssm_conv`` then
the bias and SiLU llama.cpp's Mamba graph adds, and ``ggml_ssm_scan`` with the states gathered by
``ids``; gguflm's kernels must give the same bits for the outputs and the new states, at 1 and 2
threads, for several sequences of equal length (llama.cpp's equal split) in rows out of order.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _ggml
from gguflm._ext import ssm
from gguflm.bench import ggml_peer

_P = ctypes.c_void_p
_F32, _I32 = 0, 26


def _bind(base: ctypes.CDLL) -> None:
    for name, args in (("ggml_new_tensor", [_P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]),
                       ("ggml_ssm_conv", [_P, _P, _P]), ("ggml_add", [_P, _P, _P]), ("ggml_silu", [_P, _P]),
                       ("ggml_ssm_scan", [_P, _P, _P, _P, _P, _P, _P, _P, ctypes.c_int64])):
        fn = getattr(base, name)
        fn.restype, fn.argtypes = _P, args


class _Graph:
    """A ggml context whose tensors are numpy arrays (ggml's ne is the numpy shape reversed)."""

    def __init__(self, nbytes: int):
        self.base, self.cpu = ggml_peer.libraries()
        _bind(self.base)
        self.ctx = self.base.ggml_init(ggml_peer.InitParams(nbytes + (8 << 20), None, False))

    def tensor(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a)   # held while its bytes are copied
        ne = (ctypes.c_int64 * a.ndim)(*a.shape[::-1])
        t = self.base.ggml_new_tensor(self.ctx, _I32 if a.dtype == np.int32 else _F32, a.ndim, ne)
        ctypes.memmove(self.base.ggml_get_data(t), a.ctypes.data, a.nbytes)
        return t

    def compute(self, out: int, n_threads: int, n: int) -> np.ndarray:
        graph = self.base.ggml_new_graph(self.ctx)
        self.base.ggml_build_forward_expand(graph, out)
        assert self.cpu.ggml_graph_compute_with_ctx(self.ctx, graph, n_threads) == 0
        data = ctypes.cast(self.base.ggml_get_data(out), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(data, shape=(n,)).copy()

    def close(self) -> None:
        self.base.ggml_free(self.ctx)


def ggml_conv(state: np.ndarray, x: np.ndarray, w: np.ndarray, b: np.ndarray, n_threads: int) -> np.ndarray:
    """silu(ggml_ssm_conv(concat(state, x^T)) + b): state [n_s, d_inner, d_conv - 1], x [n_s, n_t,
    d_inner] -> [n_s, n_t, d_inner]."""
    g = _Graph(4 * (state.size + 4 * x.size + w.size))
    try:
        sx = np.concatenate([state, x.transpose(0, 2, 1)], axis=2)
        out = g.base.ggml_silu(g.ctx, g.base.ggml_add(g.ctx, g.base.ggml_ssm_conv(g.ctx, g.tensor(sx), g.tensor(w)),
                                                      g.tensor(b)))
        return g.compute(out, n_threads, x.size).reshape(x.shape)
    finally:
        g.close()


def ggml_scan(states: np.ndarray, ids: np.ndarray, x, dt, A, B, C, n_threads: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml_ssm_scan over states [n_rows, d_inner, d_state] gathered by ids; x [n_s, n_t, d_inner];
    Mamba-1: dt [n_s, n_t, d_inner], A [d_inner, d_state], B, C [n_s, n_t, d_state]; Mamba-2: dt
    [n_s, n_t, n_head], A [n_head, 1], B, C [n_s, n_t, n_group, d_state] -> y [n_s, n_t, d_inner],
    the sequences' new states [n_s, d_inner, d_state]."""
    n_s, n_t, d_inner = x.shape
    n_head, d_state = dt.shape[2], states.shape[2]
    g = _Graph(4 * (states.size + 4 * x.size + 2 * B.size + A.size + n_s * d_inner * d_state))
    try:
        out = g.base.ggml_ssm_scan(g.ctx, g.tensor(states.reshape(-1, n_head, d_inner // n_head, d_state)),
                                   g.tensor(x.reshape(n_s, n_t, n_head, d_inner // n_head)), g.tensor(dt),
                                   g.tensor(A), g.tensor(B.reshape(n_s, n_t, -1, d_state)),
                                   g.tensor(C.reshape(n_s, n_t, -1, d_state)), g.tensor(ids.astype(np.int32)), 1)
        flat = g.compute(out, n_threads, x.size + n_s * d_inner * d_state)
        return flat[:x.size].reshape(x.shape), flat[x.size:].reshape(n_s, d_inner, d_state)
    finally:
        g.close()


@st.composite
def _shapes(draw: st.DrawFn) -> dict:
    return {"n_s": draw(st.integers(1, 3)), "n_t": draw(st.integers(1, 5)), "d_inner": draw(st.sampled_from([8, 16, 40, 64])),
            "d_conv": draw(st.integers(2, 4)), "d_state": draw(st.sampled_from([1, 4, 16])),
            "n_threads": draw(st.integers(1, 2)), "seed": draw(st.integers(0, 2**16))}


@settings(max_examples=25, deadline=None)
@given(_shapes())
def test_conv_and_scan_equal_ggml(shape: dict) -> None:
    _ggml.require_ggml()
    n_s, n_t, d_inner, d_conv, d_state = (shape[k] for k in ("n_s", "n_t", "d_inner", "d_conv", "d_state"))
    rng = np.random.default_rng(shape["seed"])
    f32 = lambda *s, scale=1.0: (scale * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    n_rows = n_s + 2
    rows = rng.permutation(n_rows)[:n_s]                        # each sequence's state row
    cells = np.repeat(rows, n_t).astype(np.int64)
    with _ggml.same_arithmetic():
        # conv: the states [n_rows, d_inner, d_conv - 1] and the inputs as strided rows of a wider block
        r = f32(n_rows, d_inner * (d_conv - 1))
        xz = f32(n_s * n_t, 2 * d_inner)
        w, b = f32(d_inner, d_conv, scale=0.5), f32(d_inner, scale=0.1)
        want = ggml_conv(r[rows].reshape(n_s, d_inner, d_conv - 1), xz[:, :d_inner].reshape(n_s, n_t, d_inner), w, b,
                         shape["n_threads"])
        window = np.concatenate([r[rows].reshape(n_s, d_inner, d_conv - 1),
                                 xz[:, :d_inner].reshape(n_s, n_t, d_inner).transpose(0, 2, 1)], axis=2)
        out = np.empty((n_s * n_t, d_inner), np.float32)
        r_before = r.copy()
        ssm.ssm_conv(r, cells, xz[:, :d_inner], w, b, out, shape["n_threads"])
        np.testing.assert_array_equal(out.reshape(n_s, n_t, d_inner), want)
        np.testing.assert_array_equal(r[rows].reshape(n_s, d_inner, d_conv - 1), window[:, :, n_t:])
        others = np.setdiff1d(np.arange(n_rows), rows)
        np.testing.assert_array_equal(r[others], r_before[others])

        # scan: dt around the softplus threshold (20) too
        s = f32(n_rows, d_inner * d_state, scale=0.5)
        x, dt = f32(n_s * n_t, d_inner), f32(n_s * n_t, d_inner, scale=3.0)
        dt[0, 0] = 25.0
        A = -np.exp(f32(d_inner, d_state, scale=0.5))
        xdb = f32(n_s * n_t, 3 + 2 * d_state)                     # dt rank 3, then B and C
        B, C = xdb[:, 3:3 + d_state], xdb[:, 3 + d_state:]
        D = f32(d_inner)
        y, states = ggml_scan(s.reshape(n_rows, d_inner, d_state), rows, x.reshape(n_s, n_t, d_inner),
                              dt.reshape(n_s, n_t, d_inner), A, B.reshape(n_s, n_t, d_state),
                              C.reshape(n_s, n_t, d_state), shape["n_threads"])
        out = np.empty((n_s * n_t, d_inner), np.float32)
        ssm.ssm_scan(s, cells, x, dt, A, B, C, D, out, shape["n_threads"])
        np.testing.assert_array_equal(out, (y.reshape(-1, d_inner) + x * D).astype(np.float32))
        np.testing.assert_array_equal(s[rows].reshape(n_s, d_inner, d_state), states)


def test_kernels_refuse_bad_cells() -> None:
    r = np.zeros((2, 8 * 3), np.float32)
    x = np.zeros((4, 8), np.float32)
    w, b, out = np.zeros((8, 4), np.float32), np.zeros(8, np.float32), np.zeros((4, 8), np.float32)
    for cells in ([0, 1, 1, 1], [0, 0, 0, 0, 0], [0, 0, 0, 2], [0, 1, 0, 1]):
        with pytest.raises(ValueError):
            ssm.ssm_conv(r, np.array(cells, np.int64), x, w, b, out)


@st.composite
def _grouped_shapes(draw: st.DrawFn) -> dict:
    n_group = draw(st.sampled_from([1, 2]))
    return {"n_s": draw(st.integers(1, 3)), "n_t": draw(st.integers(1, 4)), "n_group": n_group,
            "n_head": n_group * draw(st.sampled_from([1, 2, 4])), "head_dim": draw(st.sampled_from([1, 4, 8])),
            # whole vectors (4 x 8 or 4 x 16 lanes) and a scalar rest
            "d_state": draw(st.sampled_from([16, 32, 40, 64, 128, 136])),
            "n_threads": draw(st.integers(1, 2)), "seed": draw(st.integers(0, 2**16))}


@settings(max_examples=20, deadline=None)
@given(_grouped_shapes())
def test_grouped_scan_equals_ggml(shape: dict) -> None:
    """Mamba-2's scan: one decay per head, B and C per group, dt with its bias added first."""
    _ggml.require_ggml()
    n_s, n_t, n_group, n_head, head_dim, d_state = (shape[k] for k in ("n_s", "n_t", "n_group", "n_head", "head_dim",
                                                                       "d_state"))
    d_inner = n_head * head_dim
    rng = np.random.default_rng(shape["seed"])
    f32 = lambda *s, scale=1.0: (scale * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    n_rows = n_s + 1
    rows = rng.permutation(n_rows)[:n_s]
    cells = np.repeat(rows, n_t).astype(np.int64)
    s = f32(n_rows, d_inner * d_state, scale=0.5)
    # the projection's columns: x, B, C, dt side by side (strided rows, as the graph hands them)
    cols = f32(n_s * n_t, d_inner + 2 * n_group * d_state + n_head)
    x = cols[:, :d_inner]
    B, C = cols[:, d_inner:d_inner + n_group * d_state], cols[:, d_inner + n_group * d_state:-n_head]
    dt, dt_b = cols[:, -n_head:], f32(n_head, scale=2.0)
    dt_b[0] = 24.0                                              # softplus's linear side
    A, D = -np.exp(f32(n_head, scale=0.5)), f32(n_head)
    with _ggml.same_arithmetic():
        y, states = ggml_scan(s.reshape(n_rows, d_inner, d_state), rows, x.reshape(n_s, n_t, d_inner),
                              (dt + dt_b).reshape(n_s, n_t, n_head), A.reshape(n_head, 1), B, C, shape["n_threads"])
        out = np.empty((n_s * n_t, d_inner), np.float32)
        ssm.ssm_scan_grouped(s, cells, x, dt, dt_b, A, B, C, D, n_group, out, shape["n_threads"])
    np.testing.assert_array_equal(out, y.reshape(-1, d_inner) + x * np.repeat(D, head_dim))
    np.testing.assert_array_equal(s[rows].reshape(n_s, d_inner, d_state), states)
