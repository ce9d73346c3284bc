"""RWKV's WKV kernels (src/wkv.h) against ggml-cpu's own rwkv_wkv6, rwkv_wkv7 and gated_linear_attn.

ggml (the libraries llama-cpp-python ships) computes a one-node graph over the states of the
ubatch's sequences; gguflm's kernels, working in place on state rows out of order, must give the
same bits for the outputs and the new states, at 1 and 2 threads, for several sequences of equal
length (llama.cpp's equal split).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _ggml
from gguflm._ext import wkv
from test_recurrent_kernels import _P, _Graph


def _ggml_wkv(version: int | str, states: np.ndarray, inputs: list[np.ndarray], u: np.ndarray | None,
              head_size: int, n_threads: int, scale: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """ggml_rwkv_wkv6(k, v, r, u, w, states), ggml_rwkv_wkv7(r, w, k, v, a, b, states) or
    (version "gla") ggml_gated_linear_attn(k, v, q, g, states, scale) on inputs [n_tokens, n] and
    the sequences' states [n_s, n * head_size] -> (y [n_tokens, n], new states)."""
    n_tokens, n = inputs[0].shape
    g = _Graph(4 * (sum(x.size for x in inputs) + 3 * states.size + n_tokens * n))
    try:
        name = "ggml_gated_linear_attn" if version == "gla" else f"ggml_rwkv_wkv{version}"
        fn = getattr(g.base, name)
        fn.restype, fn.argtypes = _P, [_P] * {6: 7, 7: 8, "gla": 6}[version] + ([ctypes.c_float] if version == "gla" else [])
        heads = [g.tensor(x.reshape(n_tokens, n // head_size, head_size)) for x in inputs]
        if version == 6:
            k, v, r, w = heads
            out = fn(g.ctx, k, v, r, g.tensor(u.reshape(n // head_size, head_size)), w, g.tensor(states))
        elif version == "gla":
            out = fn(g.ctx, *heads, g.tensor(states), scale)
        else:
            out = fn(g.ctx, *heads, g.tensor(states))
        flat = g.compute(out, n_threads, n_tokens * n + states.size)
        return flat[:n_tokens * n].reshape(n_tokens, n), flat[n_tokens * n:].reshape(states.shape)
    finally:
        g.close()


@st.composite
def _shapes(draw: st.DrawFn) -> dict:
    return {"n_s": draw(st.integers(1, 3)), "n_t": draw(st.integers(1, 4)), "n_head": draw(st.integers(1, 3)),
            "n_threads": draw(st.integers(1, 2)), "seed": draw(st.integers(0, 2**16))}


def _case(shape: dict, head_size: int):
    """Random inputs: a float maker, the sequences' state rows (out of order among spare ones),
    each token's row, the states [n_rows, n * head_size], and three inputs [n_tokens, n]."""
    n_s, n_t = shape["n_s"], shape["n_t"]
    n = shape["n_head"] * head_size
    rng = np.random.default_rng(shape["seed"])
    f32 = lambda *s, scale=1.0: (scale * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    n_rows = n_s + 2
    rows = rng.permutation(n_rows)[:n_s]
    cells = np.repeat(rows, n_t).astype(np.int64)
    state = f32(n_rows, n * head_size, scale=0.5)
    return f32, rows, cells, state, f32(n_s * n_t, n), f32(n_s * n_t, n), f32(n_s * n_t, n)


@settings(max_examples=15, deadline=None)
@given(_shapes(), st.sampled_from([16, 24, 64]))
def test_wkv6_equals_ggml(shape: dict, head_size: int) -> None:
    """RWKV-6: any head size (ggml's vector loop and its scalar rest round alike)."""
    _ggml.require_ggml()
    n_s, n_t, n_threads = shape["n_s"], shape["n_t"], shape["n_threads"]
    n = shape["n_head"] * head_size
    f32, rows, cells, state, k, v, r = _case(shape, head_size)
    n_rows = len(state)
    w = np.exp(-np.exp(f32(n_s * n_t, n, scale=0.5))).astype(np.float32)
    u = f32(n)
    with _ggml.same_arithmetic():
        y, states = _ggml_wkv(6, state[rows], [k, v, r, w], u, head_size, n_threads)
        out = np.empty((n_s * n_t, n), np.float32)
        before = state.copy()
        wkv.wkv6(state, cells, head_size, k, v, r, u, w, out, n_threads)
    np.testing.assert_array_equal(out, y)
    np.testing.assert_array_equal(state[rows], states)
    others = np.setdiff1d(np.arange(n_rows), rows)
    np.testing.assert_array_equal(state[others], before[others])


@settings(max_examples=15, deadline=None)
@given(_shapes(), st.sampled_from([16, 24, 64]))
def test_gla_equals_ggml(shape: dict, head_size: int) -> None:
    """QRWKV-6's gated linear attention, q scaled as llama.cpp scales it (head_size ** -0.5)."""
    _ggml.require_ggml()
    n_s, n_t, n_threads = shape["n_s"], shape["n_t"], shape["n_threads"]
    n = shape["n_head"] * head_size
    f32, rows, cells, state, k, v, q = _case(shape, head_size)
    g = np.exp(-np.exp(f32(n_s * n_t, n, scale=0.5))).astype(np.float32)
    scale = float(np.float32(head_size ** -0.5))
    with _ggml.same_arithmetic():
        y, states = _ggml_wkv("gla", state[rows], [k, v, q, g], None, head_size, n_threads, scale)
        out = np.empty((n_s * n_t, n), np.float32)
        wkv.gla(state, cells, head_size, k, v, q, g, scale, out, n_threads)
    np.testing.assert_array_equal(out, y)
    np.testing.assert_array_equal(state[rows], states)


@settings(max_examples=15, deadline=None)
@given(_shapes(), st.sampled_from([64, 128]))
def test_wkv7_equals_ggml(shape: dict, head_size: int) -> None:
    """RWKV-7: the two dots per state row in ggml's lanes, at the machine's arithmetic."""
    _ggml.require_ggml()
    n_s, n_t, n_threads = shape["n_s"], shape["n_t"], shape["n_threads"]
    n = shape["n_head"] * head_size
    f32, rows, cells, state, r, k, v = _case(shape, head_size)
    w = np.exp(-0.6 / (1 + np.exp(-f32(n_s * n_t, n)))).astype(np.float32)
    kk = f32(n_s * n_t, n)
    kk /= np.linalg.norm(kk.reshape(n_s * n_t, -1, head_size), axis=2).repeat(head_size, axis=1)
    a_gate = (1 / (1 + np.exp(-f32(n_s * n_t, n)))).astype(np.float32)
    a, b = -kk, (kk * a_gate).astype(np.float32)
    with _ggml.same_arithmetic():
        y, states = _ggml_wkv(7, state[rows], [r, w, k, v, a, b], None, head_size, n_threads)
        out = np.empty((n_s * n_t, n), np.float32)
        wkv.wkv7(state, cells, head_size, r, w, k, v, a, b, out, n_threads)
    np.testing.assert_array_equal(out, y)
    np.testing.assert_array_equal(state[rows], states)


def test_wkv_refuses_bad_shapes() -> None:
    state, cells = np.zeros((2, 64 * 64), np.float32), np.zeros(3, np.int64)
    x, out = np.zeros((3, 64), np.float32), np.zeros((3, 64), np.float32)
    with pytest.raises(ValueError, match="multiple"):
        wkv.wkv7(np.zeros((2, 32 * 64), np.float32), cells, 32, x, x, x, x, x, x, out)
    with pytest.raises(ValueError, match="whole heads"):
        wkv.wkv6(state, cells, 48, x, x, x, np.zeros(64, np.float32), x, out)
    with pytest.raises(ValueError, match="state rows"):
        wkv.wkv6(state, np.full(3, 4, np.int64), 64, x, x, x, np.zeros(64, np.float32), x, out)
    with pytest.raises(ValueError, match="sequence after sequence"):
        wkv.wkv6(state, np.array([0, 0, 1], np.int64), 64, x, x, x, np.zeros(64, np.float32), x, out)
