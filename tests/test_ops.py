"""Forward-pass kernels against float64 numpy references that apply ggml's roundings."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gguflm import system
from gguflm._ext import ops

ISAS = system.supported_isas()


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float64)


@pytest.fixture(params=system.ARITHMETICS)
def arithmetic(request):
    """Each ggml build's float rounding in turn, the default restored afterwards."""
    with system.using(arithmetic=request.param):
        yield request.param


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 300), st.integers(0, 2**31 - 1), st.booleans())
def test_rms_norm(n_rows, n, seed, with_weight):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_rows, n)) * rng.uniform(0.01, 100)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32) if with_weight else None
    out = np.empty_like(x)
    ops.rms_norm(x, w, 1e-6, out, n_threads=2)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-6)
    if w is not None:
        ref = ref * w
    np.testing.assert_allclose(out, ref, rtol=3e-6, atol=1e-30)


def test_rms_norm_in_place_and_shapes():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    expected = np.empty_like(x)
    ops.rms_norm(x, None, 1e-5, expected)
    ops.rms_norm(x, None, 1e-5, x)
    np.testing.assert_array_equal(x, expected)
    with pytest.raises(ValueError):
        ops.rms_norm(x, np.ones(3, np.float32), 1e-5, x)
    with pytest.raises(ValueError):
        ops.rms_norm(x, None, 1e-5, np.empty((3, 5), np.float32))


def rope_reference(x, pos, n_heads, head_dim, n_dims, neox, base):
    x = x.astype(np.float64).reshape(len(pos), n_heads, head_dim).copy()
    inv = base ** (-np.arange(0, n_dims, 2, dtype=np.float64) / n_dims)
    ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]       # [n_tok, n_dims/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if neox:
        a, b = x[..., : n_dims // 2].copy(), x[..., n_dims // 2 : n_dims].copy()
        x[..., : n_dims // 2], x[..., n_dims // 2 : n_dims] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:n_dims:2].copy(), x[..., 1:n_dims:2].copy()
        x[..., 0:n_dims:2], x[..., 1:n_dims:2] = a * c - b * s, a * s + b * c
    return x.reshape(len(pos), -1)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_dims", [64, 32])
def test_rope_matches_reference(neox, n_dims):
    rng = np.random.default_rng(1)
    n_tok, n_heads, head_dim = 7, 3, 64
    x = rng.standard_normal((n_tok, n_heads * head_dim)).astype(np.float32)
    pos = np.array([0, 1, 2, 17, 100, 511, 2000], dtype=np.int32)
    ref = rope_reference(x, pos, n_heads, head_dim, n_dims, neox, 10000.0)
    ops.rope(x, pos, n_heads, head_dim, n_dims, neox, 10000.0, n_threads=2)
    # the running product of theta (as ggml) drifts from the exact power by a few ulps per step
    np.testing.assert_allclose(x, ref, rtol=0, atol=2e-3)
    assert np.abs(x - ref)[:3].max() < 1e-5   # small positions: tight


def test_rope_position_zero_is_identity_and_rotation_preserves_norm():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 128)).astype(np.float32)
    y = x.copy()
    ops.rope(y, np.array([0, 9], np.int32), 2, 64, 64, True, 10000.0)
    np.testing.assert_array_equal(y[0], x[0])
    np.testing.assert_allclose(np.linalg.norm(y[1].reshape(2, 64), axis=1),
                               np.linalg.norm(x[1].reshape(2, 64), axis=1), rtol=1e-5)


def test_swiglu_and_silu_accuracy(arithmetic):
    x = np.linspace(-60, 90, 4001, dtype=np.float32)[None, :]
    up = np.ones_like(x)
    out = np.empty_like(x)
    ops.swiglu(x, up, out)
    x64 = x.astype(np.float64)
    ref = x64 / (1 + np.exp(-x64))
    # ggml's vector expf: within 1.45 ulp + 0.5; the divide adds half an ulp
    np.testing.assert_allclose(out, ref, rtol=3 * 2.0**-23, atol=0)
    # like ggml's, exp(-x) overflows to inf past 88.38, so silu(x) is -0 there
    tail = np.array([[-89.0, -100.0, -1e30]], dtype=np.float32)
    ops.swiglu(tail, np.ones_like(tail), tail)
    assert np.all(tail == 0)


def test_geglu_uses_the_fp16_table():
    table = ops.gelu_table().astype(np.float64)
    vals = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)
    finite = np.isfinite(vals)
    finite[finite] = np.abs(vals[finite]) < 10
    vals[~finite] = 0.0
    # ggml evaluates the formula in float32 (1 + tanh cancels in the far negative tail, so a
    # float64 reference would not do); numpy's float32 tanh may differ from libm's by an ulp
    v32 = vals.astype(np.float32)
    c = np.float32(np.sqrt(2 / np.pi))
    ref = f16(np.float32(0.5) * v32 * (np.float32(1) + np.tanh(c * v32 * (np.float32(1) + np.float32(0.044715) * v32 * v32))))
    diff = table[finite] != ref[finite]
    assert diff.mean() < 0.01
    step = np.spacing(np.abs(ref[finite]).astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(table[finite] - ref[finite]) <= np.maximum(step, 2e-6))
    x = np.array([[-11.0, -0.5, 0.0, 0.3, 2.0, 12.0]], dtype=np.float32)
    up = np.full_like(x, 2.0)
    out = np.empty_like(x)
    ops.geglu(x, up, out)
    expected = [0.0] + [table[np.float16(v).view(np.uint16)] * 2 for v in x[0, 1:5]] + [24.0]
    np.testing.assert_array_equal(out[0], np.array(expected, dtype=np.float32))


def tname(cache):
    return {np.float16: "f16", np.float32: "f32"}[cache.dtype.type]


def q8_0_rows(x):
    """ggml-cpu's activation Q8_0 quantization of float rows: (fp16 scales [rows, blocks], int8 values)."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(axis=2)
    d = (amax / np.float32(127)).astype(np.float16)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    qs = np.rint(blocks * inv[..., None]).astype(np.int8)
    return d, qs


def q8_0_bytes(x):
    d, qs = q8_0_rows(x)
    out = np.empty((x.shape[0], d.shape[1], 34), np.uint8)
    out[..., :2] = d.view(np.uint8).reshape(x.shape[0], -1, 2)
    out[..., 2:] = qs.view(np.uint8)
    return out.reshape(x.shape[0], -1)


def attention_reference(q, k, v, cell_pos, cell_seq, tok_pos, tok_seq, n_head, n_head_kv,
                        dk, dv, scale, causal=True, n_swa=0, softcap=0.0):
    n_tok = q.shape[0]
    out = np.zeros((n_tok, n_head * dv))
    k8, v8 = isinstance(k, tuple), isinstance(v, tuple)   # (fp16 scales, int8 values) per head
    k16 = not k8 and k.dtype == np.float16
    v16 = not v8 and v.dtype == np.float16
    for t in range(n_tok):
        for h in range(n_head):
            hkv = h // (n_head // n_head_kv)
            qv = q[t, h * dk:(h + 1) * dk]
            qv = f16(qv) if k16 else qv.astype(np.float64)
            vis = (cell_pos >= 0) & (((cell_seq >> np.uint64(tok_seq[t])) & np.uint64(1)) == 1)
            if causal:
                vis &= cell_pos <= tok_pos[t]
            if n_swa:
                vis &= tok_pos[t] - cell_pos < n_swa
            idx = np.nonzero(vis[: len(cell_pos)])[0]
            if len(idx) == 0:
                continue
            if k8:
                dq, qq = q8_0_rows(q[t:t + 1, h * dk:(h + 1) * dk])
                bk = slice(hkv * dk // 32, (hkv + 1) * dk // 32)
                isum = (k[1][idx, bk].astype(np.int64) * qq.astype(np.int64)).sum(axis=2)
                s = (k[0][idx, bk].astype(np.float64) * dq.astype(np.float64) * isum).sum(axis=1)
            else:
                s = k[idx, hkv * dk:(hkv + 1) * dk].astype(np.float64) @ qv
            if softcap:
                s = np.tanh(s / softcap) * softcap
            s = s * scale
            p = np.exp(s - s.max())
            p /= p.sum()
            if v16:
                p = f16(p)
            if v8:
                bv = slice(hkv * dv // 32, (hkv + 1) * dv // 32)
                vv = (v[0][idx, bv].astype(np.float64)[..., None] * v[1][idx, bv]).reshape(len(idx), -1)
            else:
                vv = v[idx, hkv * dv:(hkv + 1) * dv].astype(np.float64)
            out[t, h * dv:(h + 1) * dv] = p @ vv
    return out


def make_case(rng, cache_dtype, n_cells=80, n_tok=6, n_head=4, n_head_kv=2, dk=64, dv=32):
    k = rng.standard_normal((n_cells, n_head_kv * dk)).astype(cache_dtype)
    v = rng.standard_normal((n_cells, n_head_kv * dv)).astype(cache_dtype)
    cell_pos = np.full(n_cells, -1, np.int32)
    cell_seq = np.zeros(n_cells, np.uint64)
    # sequence 0 at positions 0..49 in cells 0..49, sequence 1 at 0..19 in cells 50..69
    cell_pos[:50] = np.arange(50)
    cell_seq[:50] = 1
    cell_pos[50:70] = np.arange(20)
    cell_seq[50:70] = 2
    tok_pos = np.array([49, 45, 3, 19, 0, 10], np.int32)[:n_tok]
    tok_seq = np.array([0, 0, 0, 1, 1, 1], np.int32)[:n_tok]
    q = rng.standard_normal((n_tok, n_head * dk)).astype(np.float32)
    return q, k, v, cell_pos, cell_seq, tok_pos, tok_seq


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cache_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("n_swa,softcap", [(0, 0.0), (8, 0.0), (0, 30.0)])
def test_attention_matches_reference(isa, cache_dtype, n_swa, softcap, arithmetic):
    rng = np.random.default_rng(3)
    q, k, v, cell_pos, cell_seq, tok_pos, tok_seq = make_case(rng, cache_dtype)
    out = np.empty((q.shape[0], 4 * 32), np.float32)
    with system.using(isa=isa):
        ops.attention(q, k, tname(k), v, tname(v), 80, cell_pos, cell_seq, tok_pos, tok_seq, 4, 2, 64, 32, 0.125, out,
                      n_swa=n_swa, softcap=softcap, n_threads=2)
    ref = attention_reference(q, k, v, cell_pos, cell_seq, tok_pos, tok_seq, 4, 2, 64, 32, 0.125,
                              n_swa=n_swa, softcap=softcap)
    # probabilities are rounded to fp16 for an fp16 V (as ggml does): an ulp of float exp moves an
    # occasional p across a rounding boundary, by 2^-11 of p
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-4 if cache_dtype is np.float16 else 2e-5)


def test_attention_with_q8_0_caches():
    rng = np.random.default_rng(8)
    q, k, v, cell_pos, cell_seq, tok_pos, tok_seq = make_case(rng, np.float32)
    k8, v8 = q8_0_bytes(k), q8_0_bytes(v)
    out = np.empty((q.shape[0], 4 * 32), np.float32)
    ops.attention(q, k8, "q8_0", v8, "q8_0", 80, cell_pos, cell_seq, tok_pos, tok_seq, 4, 2, 64, 32,
                  0.125, out, n_threads=2)
    ref = attention_reference(q, q8_0_rows(k), q8_0_rows(v), cell_pos, cell_seq, tok_pos, tok_seq,
                              4, 2, 64, 32, 0.125)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-5)
    # and it is close to the unquantized attention
    exact = attention_reference(q, k, v, cell_pos, cell_seq, tok_pos, tok_seq, 4, 2, 64, 32, 0.125)
    assert np.abs(out - exact).max() < 0.05


@pytest.mark.skipif(len(ISAS) < 2, reason="this CPU has no AVX2/F16C")
@pytest.mark.parametrize("n_tok", [1, 6])   # single tokens take vec_dot's lanes, batches sgemm's
@pytest.mark.parametrize("cache_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("dk,dv", [(64, 32), (128, 96)])   # value dimensions in passes of 64, then 8
def test_attention_isas_agree_bit_for_bit(arithmetic, n_tok, cache_dtype, dk, dv):
    rng = np.random.default_rng(4)
    q, k, v, cell_pos, cell_seq, tok_pos, tok_seq = make_case(rng, cache_dtype, n_tok=n_tok, dk=dk, dv=dv)
    results = []
    for isa in ISAS:
        out = np.empty((q.shape[0], 4 * dv), np.float32)
        with system.using(isa=isa):
            ops.attention(q, k, tname(k), v, tname(v), 80, cell_pos, cell_seq, tok_pos, tok_seq, 4, 2, dk, dv, 0.125,
                          out)
        results.append(out)
    for isa, out in zip(ISAS[1:], results[1:]):
        np.testing.assert_array_equal(out, results[0], err_msg=isa)


def test_attention_arithmetics_round_differently():
    """The AVX2 and AVX-512 builds' roundings are both faithful, but they are not the same; the
    AVX-512 builds (with or without AVX512_BF16, whatever GCC's tuning) compute the ops alike."""
    rng = np.random.default_rng(6)
    q, k, v, cell_pos, cell_seq, tok_pos, tok_seq = make_case(rng, np.float16)
    outs = {}
    for name in system.ARITHMETICS:
        outs[name] = np.empty((q.shape[0], 128), np.float32)
        with system.using(arithmetic=name):
            ops.attention(q, k, "f16", v, "f16", 80, cell_pos, cell_seq, tok_pos, tok_seq, 4, 2, 64, 32, 0.125,
                          outs[name])
    assert not np.array_equal(outs["avx2"], outs["avx512"])
    np.testing.assert_allclose(outs["avx2"], outs["avx512"], rtol=0, atol=1e-5)
    for name in ("avx512bf16", "zen4"):
        np.testing.assert_array_equal(outs[name], outs["avx512"], err_msg=name)
    with pytest.raises(ValueError):
        system.set_arithmetic("sse")


def test_attention_thread_count_does_not_change_results():
    rng = np.random.default_rng(5)
    q, k, v, cell_pos, cell_seq, tok_pos, tok_seq = make_case(rng, np.float16)
    outs = []
    for nt in (1, 2, 3):
        out = np.empty((q.shape[0], 128), np.float32)
        ops.attention(q, k, tname(k), v, tname(v), 80, cell_pos, cell_seq, tok_pos, tok_seq, 4, 2, 64, 32, 0.125, out,
                      n_threads=nt)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_attention_rejects_bad_arguments():
    rng = np.random.default_rng(6)
    q, k, v, cell_pos, cell_seq, tok_pos, tok_seq = make_case(rng, np.float16)
    out = np.empty((q.shape[0], 128), np.float32)
    args = (cell_pos, cell_seq, tok_pos, tok_seq)
    with pytest.raises(ValueError):
        ops.attention(q, k, tname(k), v, tname(v), 81, *args, 4, 2, 64, 32, 0.1, out)          # n_kv past the cache
    with pytest.raises(ValueError):
        ops.attention(q, k, tname(k), v, tname(v), 80, *args, 4, 3, 64, 32, 0.1, out)          # heads not a multiple
    with pytest.raises(TypeError):
        ops.attention(q, k.astype(np.float64), "f16", v, "f16", 80, *args, 4, 2, 64, 32, 0.1, out)
    with pytest.raises(ValueError):
        ops.attention(q, k, "q4_0", v, "f16", 80, *args, 4, 2, 64, 32, 0.1, out)
    with pytest.raises(ValueError):
        ops.attention(q, k, tname(k), v, tname(v), 80, cell_pos, cell_seq, tok_pos, np.full(6, 64, np.int32),
                      4, 2, 64, 32, 0.1, out)
