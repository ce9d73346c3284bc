"""The per-ISA copies of the recurrent kernels (src/ssm_rows.inc, src/delta_net_rows.inc) give the
same bits: Mamba's convolution and scans, and the gated delta-net (its fused AVX2 rows with the
reduction in registers, taken where d is a multiple of the dot's step), on every ISA the CPU runs
and both arithmetics' lane counts, at 1 and 2 threads. test_recurrent_kernels.py and
test_delta_net_kernels.py check the default copy against ggml-cpu itself."""

from __future__ import annotations

import numpy as np
import pytest

from gguflm import system
from gguflm._ext import delta_net, ssm

ISAS = system.supported_isas()
ARITHS = [a for a in ("avx2", "zen4") if a in system.ARITHMETICS]


def _rng(seed: int):
    rng = np.random.default_rng(seed)
    return lambda *s, scale=1.0: (scale * rng.standard_normal(s)).astype(np.float32)


def _each_isa(run, arith: str) -> list:
    """``run()`` on a fresh copy of its inputs under every ISA."""
    results = []
    for isa in ISAS:
        with system.using(isa=isa, arithmetic=arith):
            results.append(run())
    return results


def _assert_all_equal(results: list) -> None:
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("arith", ARITHS)
@pytest.mark.parametrize("n_threads", [1, 2])
def test_mamba_kernels_same_on_every_isa(arith: str, n_threads: int) -> None:
    f32 = _rng(7)
    n_s, n_t, n_head, head_dim, d_state, d_conv, n_group = 2, 3, 4, 8, 136, 4, 2   # 136: vectors and a rest
    d_inner = n_head * head_dim
    cells = np.repeat([2, 0], n_t).astype(np.int64)
    r0, xz = f32(3, d_inner * (d_conv - 1)), f32(n_s * n_t, 2 * d_inner)
    w, b = f32(d_inner, d_conv, scale=0.5), f32(d_inner, scale=0.1)
    s0, x, dt = f32(3, d_inner * d_state, scale=0.5), f32(n_s * n_t, d_inner), f32(n_s * n_t, n_head, scale=3.0)
    dt_b, A, D = f32(n_head), -np.exp(f32(n_head, scale=0.5)), f32(n_head)
    BC = f32(n_s * n_t, 2 * n_group * d_state)
    A1, dt1 = -np.exp(f32(d_inner, 16, scale=0.5)), f32(n_s * n_t, d_inner)
    s1, BC1 = f32(3, d_inner * 16, scale=0.5), f32(n_s * n_t, 32)

    def run():
        r, s, s_1 = r0.copy(), s0.copy(), s1.copy()
        conv = np.empty((n_s * n_t, d_inner), np.float32)
        ssm.ssm_conv(r, cells, xz[:, :d_inner], w, b, conv, n_threads)
        grouped = np.empty_like(conv)
        ssm.ssm_scan_grouped(s, cells, x, dt, dt_b, A, BC[:, :n_group * d_state], BC[:, n_group * d_state:], D,
                             n_group, grouped, n_threads)
        mamba1 = np.empty_like(conv)
        ssm.ssm_scan(s_1, cells, x, dt1, A1, BC1[:, :16], BC1[:, 16:], D.repeat(head_dim), mamba1, n_threads)
        return conv, r, grouped, s, mamba1, s_1

    results = _each_isa(run, arith)
    assert all(np.isfinite(a).all() for a in results[0])
    _assert_all_equal(results)


@pytest.mark.parametrize("arith", ARITHS)
@pytest.mark.parametrize("d", [64, 128, 40])   # whole steps of 8 and 16 lanes, and not
def test_delta_net_same_on_every_isa(arith: str, d: int) -> None:
    f32 = _rng(d)
    n_s, n_t, n_k, n_v = 2, 3, 2, 4
    cells = np.repeat([1, 2], n_t).astype(np.int64)
    q, k, v = f32(n_s * n_t, n_k * d, scale=0.2), f32(n_s * n_t, n_k * d, scale=0.2), f32(n_s * n_t, n_v * d)
    g, beta = -np.abs(f32(n_s * n_t, n_v)), 1 / (1 + np.exp(-f32(n_s * n_t, n_v)))
    s0 = f32(3, n_v * d * d, scale=0.1)

    def run():
        s = s0.copy()
        out = np.empty((n_s * n_t, n_v * d), np.float32)
        delta_net.gated_delta_net(s, cells, q, k, v, g, beta.astype(np.float32), out, 2)
        return out, s

    results = _each_isa(run, arith)
    assert np.isfinite(results[0][0]).all()
    _assert_all_equal(results)
