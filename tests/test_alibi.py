"""ALiBi in the cached attention, and the families that attend with it.

The kernel (``ops.attention`` with ``max_bias``) against a float64 numpy form: each visible
score gets slope(h) * -|p_cell - p_token|, the slopes as ggml's soft_max computes them (head
counts that are not powers of two take the odd powers of the second base), over a cache with
holes (cells freed by seq_rm), several sequences and shifted positions.
"""

from __future__ import annotations

import numpy as np
import pytest

from gguflm import system
from gguflm._ext import ops

ISAS = system.supported_isas()


def alibi_slopes(max_bias: float, n_head: int) -> np.ndarray:
    """ALiBi's slope of each head: m0^(h+1) for the first 2^floor(log2 n_head) heads, then the odd
    powers of m1 (ggml's soft_max, computed in float32 as it does)."""
    n_log2 = 1 << int(np.floor(np.log2(n_head)))
    m0 = np.float32(2.0) ** np.float32(-max_bias / n_log2)
    m1 = np.float32(2.0) ** np.float32(-(max_bias / 2.0) / n_log2)
    return np.array([m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_head)],
                    np.float64)


def alibi_attention_reference(q, k, v, cell_pos, cell_seq, tok_pos, tok_seq, n_head, n_head_kv, d, scale,
                              max_bias):
    """float64 softmax(q k^T * scale + slope(h) * -|p_cell - p_tok|) v over the cells each token
    sees (its sequence, not in its future); K and V as the cache holds them (f16 rounded)."""
    slopes = alibi_slopes(max_bias, n_head)
    out = np.zeros((q.shape[0], n_head * d))
    f16 = k.dtype == np.float16
    for t in range(q.shape[0]):
        vis = (cell_pos >= 0) & (((cell_seq >> np.uint64(tok_seq[t])) & np.uint64(1)) == 1) & (cell_pos <= tok_pos[t])
        idx = np.flatnonzero(vis)
        for h in range(n_head):
            hk = h // (n_head // n_head_kv)
            qv = q[t, h * d:(h + 1) * d].astype(np.float16 if f16 else np.float32).astype(np.float64)
            s = k[idx, hk * d:(hk + 1) * d].astype(np.float64) @ qv * scale
            s -= slopes[h] * np.abs(cell_pos[idx] - tok_pos[t])
            p = np.exp(s - s.max())
            p /= p.sum()
            out[t, h * d:(h + 1) * d] = p @ v[idx, hk * d:(hk + 1) * d].astype(np.float64)
    return out


def alibi_case(rng, dtype, n_head, n_head_kv, d=32, n_tok=6):
    """A cache of 96 cells: sequence 0 at positions 0..39 with cells 10..19 freed (seq_rm), then
    shifted by +7 from position 20 on (seq_add), sequence 1 at 0..29 from cell 60, and a cell
    both share; the tokens continue both sequences (or re-enter the hole)."""
    n_cells = 96
    cell_pos = np.full(n_cells, -1, np.int32)
    cell_seq = np.zeros(n_cells, np.uint64)
    cell_pos[:40] = np.arange(40)
    cell_pos[20:40] += 7
    cell_seq[:40] = 1
    cell_pos[10:20], cell_seq[10:20] = -1, 0
    cell_pos[60:90], cell_seq[60:90] = np.arange(30), 2
    cell_pos[90], cell_seq[90] = 3, 3
    tok_pos = np.array([46, 47, 12, 29, 3, 20], np.int32)[:n_tok]
    tok_seq = np.array([0, 0, 0, 1, 1, 1], np.int32)[:n_tok]
    k = rng.standard_normal((n_cells, n_head_kv * d)).astype(dtype)
    v = rng.standard_normal((n_cells, n_head_kv * d)).astype(dtype)
    q = rng.standard_normal((n_tok, n_head * d)).astype(np.float32)
    return q, k, v, cell_pos, cell_seq, tok_pos, tok_seq


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("n_tok", [1, 6])   # a generation step, and a batch (F16: the block path)
@pytest.mark.parametrize("n_head,n_head_kv,max_bias", [(8, 8, 8.0), (12, 4, 8.0), (6, 3, 3.0), (1, 1, 8.0)])
def test_cached_attention_adds_alibi_biases(isa, dtype, n_tok, n_head, n_head_kv, max_bias):
    rng = np.random.default_rng(n_head * 10 + n_tok)
    q, k, v, cell_pos, cell_seq, tok_pos, tok_seq = alibi_case(rng, dtype, n_head, n_head_kv, n_tok=n_tok)
    scale = 1.0 / np.sqrt(32.0)
    out = np.empty((n_tok, n_head * 32), np.float32)
    with system.using(isa=isa):
        ops.attention(q, k, "f16" if dtype is np.float16 else "f32", v, "f16" if dtype is np.float16 else "f32",
                      len(cell_pos), cell_pos, cell_seq, tok_pos, tok_seq, n_head, n_head_kv, 32, 32, scale, out,
                      n_threads=2, max_bias=max_bias)
    ref = alibi_attention_reference(q, k, v, cell_pos, cell_seq, tok_pos, tok_seq, n_head, n_head_kv, 32, scale,
                                    max_bias)
    # an f16 V takes probabilities rounded to f16, as ggml's P·V does
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-3 if dtype is np.float16 else 2e-5)
    # and the bias matters: without it the result is another one
    plain = np.empty_like(out)
    ops.attention(q, k, "f16" if dtype is np.float16 else "f32", v, "f16" if dtype is np.float16 else "f32",
                  len(cell_pos), cell_pos, cell_seq, tok_pos, tok_seq, n_head, n_head_kv, 32, 32, scale, plain)
    assert np.abs(plain - out).max() > 1e-2


def test_alibi_slopes_match_ggml_for_every_head_count():
    """The numpy slopes are ggml's: powers of 2^(-8/n) for a power of two, then the odd powers
    of the half step for the heads past the largest power of two (12 heads: 8 + 4)."""
    np.testing.assert_allclose(alibi_slopes(8.0, 8), 2.0 ** -np.arange(1, 9), rtol=1e-6)
    s12 = alibi_slopes(8.0, 12)
    np.testing.assert_allclose(s12[:8], 2.0 ** -np.arange(1, 9), rtol=1e-6)
    np.testing.assert_allclose(s12[8:], 2.0 ** (-(np.arange(4) * 2 + 1) / 2.0), rtol=1e-6)


# -- the families, against llama.cpp

from pathlib import Path  # noqa: E402

from hypothesis import HealthCheck, example, given, settings  # noqa: E402

from _llama import LlamaDecoder, require_peer  # noqa: E402
from gguflm import Batch, Context, Model  # noqa: E402
from gguflm.ggml_types import GGMLType  # noqa: E402
from test_invariance import llama_cpp_logits, prompt_logits  # noqa: E402
from _memory_pair import decode_entries, interleaved  # noqa: E402
from tiny_models import N_VOCAB, TinyAlibi, TinyModel, tiny_alibi_models, write_tiny_alibi, write_tiny_model  # noqa: E402

TOKENS = [1] + list(range(20, 40))
MIXED = {"attn_qkv": GGMLType.Q8_0, "attn_output": GGMLType.Q4_0, "ffn_up": GGMLType.Q5_0, "ffn_down": GGMLType.IQ4_NL,
         "ffn_gate": GGMLType.Q4_0, "output": GGMLType.Q8_0, "token_embd": GGMLType.Q4_1}
EXAMPLES = [
    TinyAlibi("bloom", n_head=8, n_embd=128, types=MIXED),                        # 8 heads: powers of one base
    TinyAlibi("bloom", n_head=6, n_head_kv=2, n_embd=96, tied_output=False),      # 6: the second base's odd powers
    TinyAlibi("mpt", biases=False, metadata={"attention.max_alibi_bias": 8.0, "attention.clamp_kqv": 0.5}),
    TinyAlibi("mpt", n_head=12, n_embd=96, positions=True, metadata={"attention.max_alibi_bias": 4.0},
              types=MIXED),
    TinyAlibi("mpt", n_layer=1),                                                  # no max_alibi_bias: no biases
    TinyAlibi("jais", n_head=5, n_head_kv=5, n_embd=80, tied_output=False, metadata={"attention.max_alibi_bias": 8.0}),
    TinyAlibi("refact", fused=False, n_head=8, n_head_kv=2, n_embd=128, types=MIXED),
    TinyAlibi("refact", biases=False, n_layer=3),
]


def check_against_llama_cpp(path: Path, threads: tuple[int, ...] = (1, 4)) -> None:
    """Bit for bit at ubatch 1, 5 and the whole prompt; the same floats at every thread count."""
    with Model.load(path) as model:
        for n_ubatch in (1, 5, len(TOKENS)):
            ours = prompt_logits(model, TOKENS, threads[0], n_ubatch, "f16", "f16")
            assert np.isfinite(ours).all()
            for n_threads in threads[1:]:
                other = prompt_logits(model, TOKENS, n_threads, n_ubatch, "f16", "f16")
                assert (other.view(np.uint32) == ours.view(np.uint32)).all(), f"{n_threads} threads, ubatch {n_ubatch}"
            np.testing.assert_array_equal(ours, llama_cpp_logits(path, TOKENS, n_ubatch, "f16", "f16"),
                                          err_msg=f"ubatch {n_ubatch}")


@pytest.mark.parametrize("spec", EXAMPLES, ids=[f"{s.arch}-{i}" for i, s in enumerate(EXAMPLES)])
def test_alibi_families_give_llama_cpps_logits(tmp_path, spec):
    require_peer()
    path = tmp_path / f"{spec.arch}.gguf"
    write_tiny_alibi(spec, path, np.random.default_rng(5))
    # every thread count for the head count that is no power of two, the extremes for the others
    check_against_llama_cpp(path, (1, 2, 3, 4) if spec.n_head == 6 else (1, 4))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(spec=tiny_alibi_models())
def test_random_alibi_models_give_llama_cpps_logits(tmp_path, spec):
    require_peer()
    path = tmp_path / f"{spec.arch}.gguf"
    write_tiny_alibi(spec, path, np.random.default_rng(1))
    check_against_llama_cpp(path, threads=(1, 2))


def test_baichuan_13b_attends_with_alibi(tmp_path):
    """40 layers are Baichuan 13B to llama.cpp: ALiBi (maximum 8), no RoPE in the graph."""
    require_peer()
    path = tmp_path / "baichuan.gguf"
    write_tiny_model(TinyModel("baichuan", n_embd=32, head_dim=8, n_head=4, n_head_kv=4, n_ff=32, n_layer=40,
                               tied_output=False), path, np.random.default_rng(0))
    with Model.load(path) as model:
        assert model.hparams.f_max_alibi_bias == 8.0
    check_against_llama_cpp(path, threads=(1, 2))


def test_mpt_with_qk_norms_is_refused(tmp_path):
    """llama.cpp declares MPT's Q/K LayerNorms but its graph aborts on them (a reshape of a
    strided view): the loader names them rather than compute what llama.cpp cannot."""
    from gguflm.errors import ModelLoadError

    path = tmp_path / "mpt.gguf"
    write_tiny_alibi(TinyAlibi("mpt", qk_norm=True), path, np.random.default_rng(0))
    with pytest.raises(ModelLoadError, match="attn_k_norm"):
        Model.load(path)


SHIFT_MODELS = {
    "bloom": lambda path: write_tiny_alibi(TinyAlibi("bloom", n_head=6, n_head_kv=3, n_embd=96), path,
                                           np.random.default_rng(2)),
    # no RoPE in the graph, yet llama.cpp's K-shift rotates the cached K rows (RoPE type NORM)
    "baichuan13b": lambda path: write_tiny_model(TinyModel("baichuan", n_embd=32, head_dim=8, n_head=4, n_head_kv=4,
                                                           n_ff=32, n_layer=40, tied_output=False), path,
                                                 np.random.default_rng(2)),
}


@pytest.mark.parametrize("name", SHIFT_MODELS)
@pytest.mark.parametrize("kv_unified", [True, False])
def test_several_sequences_seq_rm_and_a_shift_give_llama_cpps_logits(tmp_path, name, kv_unified):
    """Three sequences interleaved in one batch, a step of each; seq_rm of one's tail and a hole
    in another, seq_add (ALiBi reads the shifted positions; nothing to re-rotate unless the
    architecture's RoPE type says so), seq_div, then more tokens into the freed cells: the
    positions and logits are llama.cpp's, bit for bit, with one cache or one region per sequence."""
    L = require_peer()
    path = tmp_path / f"{name}.gguf"
    SHIFT_MODELS[name](path)
    steps = [interleaved([7, 3, 5], 1),
             [(11, 7, 0, True), (12, 3, 1, True), (13, 5, 2, True)],
             ("seq_rm", 0, 5, -1), ("seq_rm", 2, 1, 3), ("seq_add", 1, 0, -1, 4), ("seq_div", 2, 0, -1, 2),
             [(21, 5, 0, True), (22, 6, 0, True), (23, 8, 1, True), (24, 3, 2, True), (25, 9, 1, True)],
             ("seq_add", 0, 2, -1, -2),
             [(31, 5, 0, True), (32, 10, 1, True)]]
    ref = LlamaDecoder(path, n_ctx=256, n_seq_max=3, n_batch=64, kv_unified=kv_unified)
    try:
        model = Model.load(path)
        ctx = Context(model, n_ctx=256, n_batch=64, n_seq_max=3, n_threads=2, n_threads_batch=2,
                      kv_unified=kv_unified)
        for step in steps:
            if isinstance(step, list):
                np.testing.assert_array_equal(decode_entries(ctx, step), ref.decode_batch(step), err_msg=str(step))
                continue
            op, *args = step
            if op == "seq_rm":
                assert ctx.memory.seq_rm(*args) == ref.seq_rm(*args)
            elif op == "seq_add":
                ctx.memory.seq_add(*args)
                ref.seq_add(*args)
            else:
                ctx.memory.seq_div(*args)
                L.llama_memory_seq_div(ref._mem, *args)
            for s in range(3):
                assert (ctx.memory.seq_pos_min(s), ctx.memory.seq_pos_max(s)) == (ref.seq_pos_min(s), ref.seq_pos_max(s))
        ctx.close()
        model.close()
    finally:
        ref.close()


def test_olmo_clamps_q_k_and_v(tmp_path):
    """OLMo's attention.clamp_kqv clamps Q, K and V apart (build_qkv's separate path): tight
    enough to cut many values, llama.cpp's logits to the bit."""
    require_peer()
    path = tmp_path / "olmo.gguf"
    write_tiny_model(TinyModel("olmo", n_embd=64, head_dim=16, n_head=4, n_head_kv=4, n_ff=64, n_layer=2,
                               metadata={"attention.clamp_kqv": 0.3}), path, np.random.default_rng(4))
    check_against_llama_cpp(path, threads=(1, 2))
    # the same weights unclamped give other logits: the clamp cuts
    plain = tmp_path / "plain.gguf"
    write_tiny_model(TinyModel("olmo", n_embd=64, head_dim=16, n_head=4, n_head_kv=4, n_ff=64, n_layer=2), plain,
                     np.random.default_rng(4))
    with Model.load(path) as clamped, Model.load(plain) as unclamped:
        assert clamped.hparams.f_clamp_kqv == np.float32(0.3)
        a, b = (prompt_logits(m, TOKENS, 1, len(TOKENS), "f16", "f16") for m in (clamped, unclamped))
        assert np.abs(a - b).max() > 1e-2
