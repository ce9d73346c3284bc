"""The encoders' kernels: LayerNorm, GELU, tanh, mean pooling and attention without a KV cache.

LayerNorm and mean pooling are checked to the bit against numpy re-implementations of ggml-cpu's
arithmetic (written from ops.cpp, vec.cpp and llamafile's sgemm, independently of the C kernels);
attention against a float64 reference, then its fast path (a sequence at a time) against the
per-token path, every ISA against every other and every thread count against one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggml_lanes import AUTOVEC_LANES, VECTOR_LANES, fma32, hsum_hadd, hsum_movehl
from gguflm import system
from gguflm._ext import ops

F32 = np.float32
ISAS = system.supported_isas()
LANES = {a: (v, 4 * v) for a, v in VECTOR_LANES.items()}     # one vector, vec_dot's four vectors


@pytest.fixture(params=system.ARITHMETICS)
def arithmetic(request):
    with system.using(arithmetic=request.param):
        yield request.param


def hsum_vec(v: np.ndarray) -> np.float32:
    """One vector's lanes as the build sums them (8: movehl; 16: upper half onto lower first)."""
    v = v.astype(F32)
    return hsum_movehl(v) if len(v) == 8 else hsum_movehl(v[:8] + v[8:])


def layer_norm_ggml(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float, arith: str) -> np.ndarray:
    """ggml_norm (mean from a double sum; squares of x - mean summed one vector at a time in float,
    the vectors and the leftovers in double), then * w, then + b."""
    vec = LANES[arith][0]
    out = np.empty_like(x)
    for r, row in enumerate(x):
        total = 0.0
        for v in row.tolist():
            total += v
        mean = F32(total) / F32(len(row))
        d = (row - mean).astype(F32)
        sq = (d * d).astype(F32)
        main = len(row) - len(row) % vec
        var = 0.0
        for i in range(0, main, vec):
            var += float(hsum_vec(sq[i:i + vec]))
        for v in sq[main:].tolist():
            var += v
        scale = F32(1) / np.sqrt(F32(F32(var / len(row)) + F32(eps)))
        out[r] = ((d * scale).astype(F32) * w).astype(F32) + b
    return out


def reduce_lanes(acc: np.ndarray) -> np.ndarray:
    """acc [lanes, n] summed over lanes in the order of the dot that keeps that many."""
    lanes = len(acc)
    if lanes == 64:
        acc = (acc[0:16] + acc[32:48]) + (acc[16:32] + acc[48:64])
    elif lanes == 32:
        y = (acc[0:8] + acc[16:24]) + (acc[8:16] + acc[24:32])
        return np.array([hsum_hadd(y[:, d]) for d in range(acc.shape[1])], F32)
    if len(acc) == 16:
        acc = acc[:8] + acc[8:]
    return np.array([hsum_movehl(acc[:, d]) for d in range(acc.shape[1])], F32)


def pool_mean_ggml(x: np.ndarray, m: np.ndarray, arith: str) -> np.ndarray:
    """mul_mat(cont(transpose(x)), m): llamafile's sgemm (one vector of lanes) when the tokens are
    whole vectors, there are two sequences or more and n % 4 == 0, else vec_dot_f32 (four vectors,
    then the leftover tokens: products rounded then added, the last n % (autovec lanes / 2) fused,
    as GCC compiled its scalar loop)."""
    vec, dot = LANES[arith]
    n_tok, n = x.shape
    lanes = vec if n_tok % vec == 0 and len(m) >= 2 and n % 4 == 0 else dot
    main = n_tok - n_tok % lanes
    left = n_tok - main
    unfused = main + left - left % (AUTOVEC_LANES[arith] // 2)
    out = np.empty((len(m), n), F32)
    for s, weights in enumerate(m):
        acc = np.zeros((lanes, n), F32)
        for t in range(main):
            acc[t % lanes] = fma32(x[t], weights[t], acc[t % lanes])
        row = reduce_lanes(acc)
        for t in range(main, n_tok):
            row = (row + (x[t] * weights[t]).astype(F32)).astype(F32) if t < unfused else fma32(x[t], weights[t], row)
        out[s] = row
    return out


def mean_matrix(seq_of_token: np.ndarray) -> np.ndarray:
    seqs = np.unique(seq_of_token)
    m = (seq_of_token[None, :] == seqs[:, None]).astype(F32)
    return m * (F32(1) / m.sum(axis=1, dtype=F32))[:, None]


# -- LayerNorm

@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 200), st.integers(0, 2**31 - 1), st.sampled_from(["avx2", "avx512"]))
def test_layer_norm_is_ggml_norm_to_the_bit(n_rows, n, seed, arith):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_rows, n)) * rng.uniform(0.01, 50) + rng.uniform(-3, 3)).astype(F32)
    w, b = rng.standard_normal(n).astype(F32), rng.standard_normal(n).astype(F32)
    out = np.empty_like(x)
    with system.using(arithmetic=arith):
        ops.layer_norm(x, w, b, 1e-12, out, n_threads=2)
    np.testing.assert_array_equal(out, layer_norm_ggml(x, w, b, 1e-12, arith))


def test_layer_norm_normalises_and_isas_agree(arithmetic):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 384)) * 7 + 2).astype(F32)
    outs = []
    for isa in ISAS:
        out = np.empty_like(x)
        with system.using(isa=isa):
            ops.layer_norm(x, None, None, 1e-5, out, n_threads=2)
        outs.append(out)
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])
    np.testing.assert_allclose(outs[0].mean(axis=1), 0, atol=1e-5)
    np.testing.assert_allclose(outs[0].std(axis=1), 1, rtol=1e-4)
    with pytest.raises(ValueError):
        ops.layer_norm(x, np.ones(3, F32), None, 1e-5, np.empty_like(x))


# -- GELU and tanh

def test_gelu_reads_ggml_table_and_saturates():
    table = ops.gelu_table().astype(F32)
    x = np.array([[-12.0, -10.0, -0.7, 0.0, 0.25, 3.5, 9.99, 10.0, 40.0]], F32)
    for isa in ISAS:
        out = np.empty_like(x)
        with system.using(isa=isa):
            ops.gelu(x, out)
        inside = table[x[0, 2:7].astype(np.float16).view(np.uint16)]
        np.testing.assert_array_equal(out[0], np.concatenate([[0.0, 0.0], inside, [10.0, 40.0]]).astype(F32))


def test_gelu_isas_agree_on_every_half_and_between():
    """The AVX2 kernels gather the table 8 at a time: every fp16 value, values between them (the
    index is rounded to nearest even), the saturation bounds, infinities and NaN."""
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(F32)
    rng = np.random.default_rng(3)
    between = (rng.standard_normal(40000) * rng.choice([1e-6, 0.1, 3, 30], 40000)).astype(F32)
    special = np.array([-10.0, 10.0, np.nextafter(F32(-10), F32(0)), np.nextafter(F32(10), F32(0)), np.inf, -np.inf,
                        np.nan, 0.0, -0.0, 65520.0, 1e-30], F32)
    x = np.concatenate([halves, between, special, np.zeros(5, F32)]).reshape(-1, 9)   # rows leave a remainder
    outs = []
    for isa in ISAS:
        gelu, geglu = np.empty_like(x), np.empty_like(x)
        with system.using(isa=isa):
            ops.gelu(x, gelu, n_threads=2)
            ops.geglu(x, x[::-1].copy(), geglu, n_threads=2)
        outs.append((gelu, geglu))
    for gelu, geglu in outs[1:]:
        np.testing.assert_array_equal(gelu.view(np.uint32), outs[0][0].view(np.uint32))
        np.testing.assert_array_equal(geglu.view(np.uint32), outs[0][1].view(np.uint32))


def test_tanh_is_libm_tanhf_on_every_isa():
    x = np.linspace(-12, 12, 1001, dtype=F32)[None, :]
    outs = []
    for isa in ISAS:
        out = np.empty_like(x)
        with system.using(isa=isa):
            ops.tanh(x, out, n_threads=2)
        outs.append(out)
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])
    np.testing.assert_allclose(outs[0], np.tanh(x.astype(np.float64)), rtol=2e-7, atol=1e-7)


# -- mean pooling

@pytest.mark.parametrize("lengths", [
    (16, 16),          # whole vectors, two sequences: sgemm's lanes
    (32,),             # one sequence: vec_dot even with whole vectors
    (9, 14),           # 23 tokens: all leftovers, 16 unfused then 7 fused (AVX-512)
    (40, 30, 3),       # 73: vec_dot's lanes, then a leftover of 9 (AVX-512) or 9 (AVX2)
    (1,),
])
def test_mean_pooling_is_ggml_mul_mat_to_the_bit(lengths, arithmetic):
    rng = np.random.default_rng(sum(lengths))
    seq = np.concatenate([np.full(n, s) for s, n in enumerate(lengths)])
    x = rng.standard_normal((len(seq), 48)).astype(F32)
    m = mean_matrix(seq)
    expected = pool_mean_ggml(x, m, arithmetic)
    for isa in ISAS:
        for n_threads in (1, 3):
            out = np.empty((len(m), 48), F32)
            with system.using(isa=isa):
                ops.pool_mean(x, m, out, n_threads=n_threads)
            np.testing.assert_array_equal(out, expected, err_msg=f"{isa}, {n_threads} threads")
    # and it is the mean
    for s in range(len(lengths)):
        np.testing.assert_allclose(expected[s], x[seq == s].mean(axis=0), rtol=1e-5, atol=1e-6)


# -- attention without a cache

def attention_reference(q, k, v, pos, seq, n_head, n_head_kv, d, scale, max_bias=0.0):
    """float64 softmax(q k^T * scale + ALiBi) v within each sequence, no causal mask."""
    n = q.shape[0]
    out = np.zeros((n, n_head * d))
    n_log2 = 1 << int(np.floor(np.log2(n_head)))
    m0, m1 = 2.0 ** (-max_bias / n_log2), 2.0 ** (-(max_bias / 2) / n_log2)
    for h in range(n_head):
        hk = h // (n_head // n_head_kv)
        slope = (m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1)) if max_bias else 0.0
        for t in range(n):
            idx = np.flatnonzero(seq == seq[t])
            s = k[idx, hk * d:(hk + 1) * d].astype(np.float64) @ q[t, h * d:(h + 1) * d] * scale
            s -= slope * np.abs(pos[idx] - pos[t])
            p = np.exp(s - s.max())
            out[t, h * d:(h + 1) * d] = (p / p.sum()) @ v[idx, hk * d:(hk + 1) * d]
    return out


def self_attention(q, k, v, pos, seq, n_head, n_head_kv, d, scale, max_bias=0.0, n_threads=2, by_sequence=True):
    """ops.attention over the tokens' own K and V; ``by_sequence`` False takes the per-token path
    (the tokens' and cells' sequence ids then live in different arrays)."""
    out = np.empty((q.shape[0], n_head * d), F32)
    cell_seq = seq if by_sequence else seq.copy()
    ops.attention(q, k, "f32", v, "f32", len(pos), pos, np.zeros(0, np.uint64), pos, seq, n_head, n_head_kv, d, d,
                  scale, out, causal=False, n_threads=n_threads, cell_seq_id=cell_seq, n_cols=len(pos),
                  max_bias=max_bias)
    return out


def attention_case(rng, lengths, n_head, n_head_kv, d, interleave=False):
    seq = np.concatenate([np.full(n, s, np.int32) for s, n in enumerate(lengths)])
    pos = np.concatenate([np.arange(n, dtype=np.int32) for n in lengths])
    if interleave:   # sequences need not be contiguous in a batch
        order = rng.permutation(len(seq))
        seq, pos = seq[order].copy(), pos[order].copy()
    q = rng.standard_normal((len(seq), n_head * d)).astype(F32)
    k = rng.standard_normal((len(seq), n_head_kv * d)).astype(F32)
    v = rng.standard_normal((len(seq), n_head_kv * d)).astype(F32)
    return q, k, v, pos, seq


@pytest.mark.parametrize("lengths,n_head,n_head_kv,d,max_bias,interleave", [
    ((7, 19, 30), 4, 4, 32, 0.0, False),
    ((7, 19, 30), 4, 2, 64, 0.0, True),
    ((33, 40), 8, 8, 32, 8.0, False),       # ALiBi (jina-bert-v2), 8 heads
    ((5, 60), 6, 6, 64, 8.0, True),         # ALiBi with a head count that is not a power of two
    ((1,), 2, 1, 32, 0.0, False),
])
def test_attention_without_cache(lengths, n_head, n_head_kv, d, max_bias, interleave, arithmetic):
    rng = np.random.default_rng(len(lengths) + d + n_head)
    q, k, v, pos, seq = attention_case(rng, lengths, n_head, n_head_kv, d, interleave)
    scale = float(F32(1) / np.sqrt(F32(d)))
    fast = self_attention(q, k, v, pos, seq, n_head, n_head_kv, d, scale, max_bias)
    np.testing.assert_allclose(fast, attention_reference(q, k, v, pos, seq, n_head, n_head_kv, d, scale, max_bias),
                               rtol=0, atol=3e-5)
    # a sequence at a time gives the per-token path's floats, on every ISA and thread count
    slow = self_attention(q, k, v, pos, seq, n_head, n_head_kv, d, scale, max_bias, by_sequence=False)
    np.testing.assert_array_equal(fast, slow)
    for isa in ISAS:
        for n_threads in (1, 3):
            with system.using(isa=isa):
                other = self_attention(q, k, v, pos, seq, n_head, n_head_kv, d, scale, max_bias, n_threads)
            np.testing.assert_array_equal(other, fast, err_msg=f"{isa}, {n_threads} threads")


def test_attention_without_cache_rejects_bad_arguments():
    rng = np.random.default_rng(0)
    q, k, v, pos, seq = attention_case(rng, (4, 4), 2, 2, 32)
    out = np.empty_like(q)
    with pytest.raises(ValueError, match="n_cols"):
        ops.attention(q, k, "f32", v, "f32", 8, pos, np.zeros(0, np.uint64), pos, seq, 2, 2, 32, 32, 0.1, out,
                      causal=False, cell_seq_id=seq, n_cols=7)
    with pytest.raises(ValueError, match="exceeds"):
        ops.attention(q, k, "f32", v, "f32", 8, pos, np.zeros(0, np.uint64), pos, seq, 2, 2, 32, 32, 0.1, out,
                      causal=False, cell_seq_id=seq[:5], n_cols=8)


@pytest.mark.parametrize("arch", ["bert", "nomic-bert", "jina-bert-v2"])
def test_attention_without_cache_is_llama_cpp_to_the_bit(arch):
    """Layer 0 of each tiny encoder as llama.cpp ran it (tests/data/arch/<arch>.npz: the Q, K, V it
    took and its output; 56 tokens in three sequences, so that ggml's tails run): 32-wide heads
    (BERT), two KV heads for four (nomic-bert), 12 heads with ALiBi, four of their slopes not powers
    of two (jina-bert-v2)."""
    from gguflm import Model

    data = Path(__file__).resolve().parent / "data" / "arch"
    ref = np.load(data / f"{arch}.npz")
    with Model.load(data / f"{arch}.gguf") as model:
        hp = model.hparams
    seq = np.repeat(np.arange(len(ref["lengths"]), dtype=np.int32), ref["lengths"])
    pos = np.concatenate([np.arange(n, dtype=np.int32) for n in ref["lengths"]])
    d = hp.n_embd_head_k
    with system.using(arithmetic="zen4"):
        out = self_attention(ref["attn_q"], ref["attn_k"], ref["attn_v"], pos, seq, hp.n_head[0], hp.n_head_kv[0], d,
                             float(F32(1) / np.sqrt(F32(d))), hp.f_max_alibi_bias)
    np.testing.assert_array_equal(out, ref["attn_out"])
