"""The gated delta-net (src/delta_net.h) and the convolutions of the delta-net and short-conv
models (src/ssm.h without a bias, with or without the SiLU) against ggml-cpu's own kernels.

ggml (the libraries llama-cpp-python ships) computes ``ggml_gated_delta_net`` (the fused op
llama.cpp's CPU backend runs for prompts and single tokens) and ``ggml_ssm_conv`` in one-node
graphs; gguflm's kernels must give the same bits for the outputs and the new states, at 1 and
2 threads, on every ISA copy, for several sequences of equal length in state rows out of order,
with key heads shared by value heads.
"""

from __future__ import annotations

import ctypes

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import _ggml
from gguflm import system
from gguflm._ext import delta_net, ssm
from test_recurrent_kernels import _P, _Graph

_SIGNATURE = [_P, _P, _P, _P, _P, _P, _P, ctypes.c_int64]


def ggml_gdn(q, k, v, g, beta, states, n_threads: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml_gated_delta_net with one snapshot: q, k [n_s, n_t, H_k, d], v [n_s, n_t, H_v, d], g,
    beta [n_s, n_t, H_v], states [n_s, H_v, d, d] -> out [n_s, n_t, H_v, d], new states."""
    g_ = _Graph(4 * (3 * q.size + 2 * v.size + 2 * states.size + 2 * g.size))
    try:
        fn = g_.base.ggml_gated_delta_net
        fn.restype, fn.argtypes = _P, _SIGNATURE
        out = fn(g_.ctx, g_.tensor(q), g_.tensor(k), g_.tensor(v), g_.tensor(g[..., None]), g_.tensor(beta[..., None]),
                 g_.tensor(states), 1)
        flat = g_.compute(out, n_threads, v.size + states.size)
        return flat[:v.size].reshape(v.shape), flat[v.size:].reshape(states.shape)
    finally:
        g_.close()


@st.composite
def _shapes(draw: st.DrawFn) -> dict:
    n_head_k = draw(st.sampled_from([1, 2]))
    return {"n_s": draw(st.integers(1, 3)), "n_t": draw(st.integers(1, 5)), "n_head_k": n_head_k,
            "n_head_v": n_head_k * draw(st.sampled_from([1, 2])),
            # whole vector steps of the dots (32 or 64 lanes) and a scalar rest
            "d": draw(st.sampled_from([8, 16, 40, 64, 72, 128])),
            "n_threads": draw(st.integers(1, 2)), "isa": draw(st.sampled_from(system.supported_isas())),
            "seed": draw(st.integers(0, 2**16))}


@settings(max_examples=25, deadline=None)
@given(_shapes())
def test_gated_delta_net_equals_ggml(shape: dict) -> None:
    _ggml.require_ggml()
    n_s, n_t, hk, hv, d = (shape[key] for key in ("n_s", "n_t", "n_head_k", "n_head_v", "d"))
    rng = np.random.default_rng(shape["seed"])
    f32 = lambda *s, scale=1.0: (scale * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    n_rows = n_s + 2
    rows = rng.permutation(n_rows)[:n_s]
    cells = np.repeat(rows, n_t).astype(np.int64)
    s = f32(n_rows, hv * d * d, scale=0.3)
    # the convolution's columns: q, k, v side by side (strided rows, as the graph hands them)
    qkv = f32(n_s * n_t, (2 * hk + hv) * d)
    q, k, v = qkv[:, :hk * d], qkv[:, hk * d:2 * hk * d], qkv[:, 2 * hk * d:]
    gb = f32(n_s * n_t, 2 * hv)
    g, beta = -np.abs(gb[:, :hv]), 1 / (1 + np.exp(-gb[:, hv:]))
    with _ggml.same_arithmetic():
        want, states = ggml_gdn(q.reshape(n_s, n_t, hk, d), k.reshape(n_s, n_t, hk, d), v.reshape(n_s, n_t, hv, d),
                                np.ascontiguousarray(g).reshape(n_s, n_t, hv), beta.reshape(n_s, n_t, hv),
                                s[rows].reshape(n_s, hv, d, d), shape["n_threads"])
        out = np.empty((n_s * n_t, hv * d), np.float32)
        s_before = s.copy()
        with system.using(isa=shape["isa"]):   # the portable copy and the AVX2 + FMA one
            delta_net.gated_delta_net(s, cells, q, k, v, g, beta, out, shape["n_threads"])
    np.testing.assert_array_equal(out.reshape(want.shape), want)
    np.testing.assert_array_equal(s[rows].reshape(states.shape), states)
    others = np.setdiff1d(np.arange(n_rows), rows)
    np.testing.assert_array_equal(s[others], s_before[others])


def ggml_conv_raw(state: np.ndarray, x: np.ndarray, w: np.ndarray, silu: bool, n_threads: int) -> np.ndarray:
    """ggml_ssm_conv(concat(state, x^T)) (then ggml_silu): state [n_s, d_inner, d_conv - 1], x
    [n_s, n_t, d_inner] -> [n_s, n_t, d_inner]."""
    g = _Graph(4 * (state.size + 4 * x.size + w.size))
    try:
        sx = np.concatenate([state, x.transpose(0, 2, 1)], axis=2)
        out = g.base.ggml_ssm_conv(g.ctx, g.tensor(sx), g.tensor(w))
        if silu:
            out = g.base.ggml_silu(g.ctx, out)
        return g.compute(out, n_threads, x.size).reshape(x.shape)
    finally:
        g.close()


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.sampled_from([8, 24, 40, 64]), st.integers(2, 4), st.booleans(),
       st.integers(1, 2), st.integers(0, 2**16))
def test_conv_without_bias_equals_ggml(n_s: int, n_t: int, d_inner: int, d_conv: int, silu: bool, n_threads: int,
                                       seed: int) -> None:
    """LFM2's short convolution (no bias, no SiLU) and the delta-net's (no bias, then SiLU)."""
    _ggml.require_ggml()
    rng = np.random.default_rng(seed)
    n_rows = n_s + 1
    rows = rng.permutation(n_rows)[:n_s]
    cells = np.repeat(rows, n_t).astype(np.int64)
    r = rng.standard_normal((n_rows, d_inner * (d_conv - 1))).astype(np.float32)
    x = rng.standard_normal((n_s * n_t, d_inner)).astype(np.float32)
    w = (0.5 * rng.standard_normal((d_inner, d_conv))).astype(np.float32)
    with _ggml.same_arithmetic():
        want = ggml_conv_raw(r[rows].reshape(n_s, d_inner, d_conv - 1), x.reshape(n_s, n_t, d_inner), w, silu, n_threads)
        window = np.concatenate([r[rows].reshape(n_s, d_inner, d_conv - 1), x.reshape(n_s, n_t, d_inner).transpose(0, 2, 1)],
                                axis=2)
        out = np.empty_like(x)
        ssm.ssm_conv(r, cells, x, w, None, out, n_threads, silu=silu)
    np.testing.assert_array_equal(out.reshape(want.shape), want)
    np.testing.assert_array_equal(r[rows].reshape(n_s, d_inner, d_conv - 1), window[:, :, n_t:])
