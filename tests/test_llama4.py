"""Llama 4 against llama.cpp.

Tiny random models (tests/tiny_models.py's :class:`TinyLlama4`: weight types mixed per tensor,
routers of spread rows so that no rounding could flip an expert) give llama.cpp's logits
(llama-cpp-python's C API) at every position of two sequences decoded together, in ubatches of
one token and of the whole batch, at 1 and 3 threads: experts every other layer or in every
layer, top-1 and top-2 sigmoid routing with the weight on the experts' input, the shared expert,
Q/K norms (and the 128-expert model without them). One sequence runs from position 8180 over
llama.cpp's chunk boundary at 8192 (llama.cpp accepts any first position of a new sequence), so
that the chunked layers' window closes and the RoPE-less layers' attention temperature grows.
"""

from __future__ import annotations

import numpy as np
import pytest

from _llama import LlamaDecoder, require_peer
from _memory_pair import decode_entries
from gguflm import Context, Model
from gguflm._ext import ops
from gguflm.errors import ModelLoadError
from gguflm.ggml_types import GGMLType
from test_model_loading import rewrite
from tiny_models import TinyLlama4, write_tiny_llama4

MIXED = {"attn_q": GGMLType.Q4_K, "attn_k": GGMLType.Q8_0, "attn_v": GGMLType.Q6_K, "attn_output": GGMLType.Q4_0,
         "ffn_gate_exps": GGMLType.Q4_K, "ffn_up_exps": GGMLType.Q5_K, "ffn_down_exps": GGMLType.Q8_0,
         "ffn_gate_inp": GGMLType.F32, "ffn_up_shexp": GGMLType.IQ4_NL, "ffn_gate": GGMLType.Q5_0,
         "ffn_down": GGMLType.Q6_K, "output": GGMLType.Q6_K, "token_embd": GGMLType.Q8_0}
CASES = {
    # Scout's pattern: experts in every other layer, top-1
    "mixed-top1": TinyLlama4(n_embd=256, head_dim=64, n_head=4, n_head_kv=2, n_ff=256, n_ff_exp=64, types=MIXED),
    # experts in every layer, two per token, a tied output
    "every-layer-top2": TinyLlama4(moe_step=1, n_expert=6, n_expert_used=2, tied_output=True),
    # 128 experts: Maverick's count, whose model has no Q/K norms
    "128-experts": TinyLlama4(n_layer=4, n_expert=128, n_ff_exp=16, types={"ffn_gate_inp": GGMLType.F32}),
}
# sequence 0 crosses the chunk at 8192; sequence 1 starts at 0; every batch fits one ubatch of
# N_CTX tokens (llama.cpp's decode of a larger ubatch is many times slower)
N_CTX = 64
SEQS = [(0, 8180, [1] + list(range(20, 39))), (1, 0, [1] + list(range(50, 59)))]


def entries(step: int) -> list[list[tuple[int, int, int, bool]]]:
    """The two sequences as batches of (token, position, sequence, output): the prompts together,
    then ``step`` tokens of each per batch."""
    first = [(tok, start + p, seq, True) for seq, start, toks in SEQS for p, tok in enumerate(toks[:8])]
    rest = [(tok, start + p, seq, True) for seq, start, toks in SEQS for p, tok in enumerate(toks) if p >= 8]
    rest.sort(key=lambda e: e[1] - (8180 if e[2] == 0 else 0))
    return [first] + [rest[i:i + step] for i in range(0, len(rest), step)]


def theirs(path, batches, n_ubatch: int) -> list[np.ndarray]:
    peer = LlamaDecoder(path, n_ctx=N_CTX, n_seq_max=2, n_threads=2, n_ubatch=n_ubatch)
    try:
        return [peer.decode_batch(b) for b in batches]
    finally:
        peer.close()


def ours(model, batches, n_ubatch: int, n_threads: int) -> list[np.ndarray]:
    with Context(model, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=n_ubatch, n_seq_max=2, n_threads=n_threads,
                 n_threads_batch=n_threads) as ctx:
        return [decode_entries(ctx, b) for b in batches]


@pytest.fixture(scope="module", params=sorted(CASES))
def llama4(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("llama4") / "llama4.gguf"
    write_tiny_llama4(CASES[request.param], path, np.random.default_rng(4))
    with Model.load(path) as model:
        yield request.param, path, model


def test_llama4_gives_llama_cpps_logits(llama4):
    """Two sequences, one over the chunk boundary, in ubatches of 1 and of the whole batch:
    llama.cpp's logits, the same floats at 1 and 3 threads."""
    require_peer()
    name, path, model = llama4
    spec, hp = CASES[name], model.hparams
    assert [hp.is_swa(il) for il in range(spec.n_layer)] == [il % 4 < 3 for il in range(spec.n_layer)]
    assert [hp.has_rope(il) for il in range(spec.n_layer)] == [(il + 1) % 4 != 0 for il in range(spec.n_layer)]
    assert hp.extras["kq_norm"] == (spec.n_expert != 128)
    batches = entries(5)
    for n_ubatch in (1, N_CTX):
        ref = theirs(path, batches, n_ubatch)
        got = ours(model, batches, n_ubatch, 1)
        for k, (a, b) in enumerate(zip(got, ref)):
            np.testing.assert_array_equal(a, b, err_msg=f"ubatch {n_ubatch}, batch {k}")
        for a, b in zip(ours(model, batches, n_ubatch, 3), got):
            np.testing.assert_array_equal(a, b, err_msg=f"3 threads, ubatch {n_ubatch}")


def test_the_chunk_and_the_temperature_change_the_logits(tmp_path):
    """The same tokens from position 8180 and from 0 give other logits past 8191 (the chunk
    closes, the temperature grows) and the same before: what the boundary test rests on."""
    path = tmp_path / "llama4.gguf"
    write_tiny_llama4(CASES["every-layer-top2"], path, np.random.default_rng(4))
    toks = SEQS[0][2]
    with Model.load(path) as model:
        far, near = (ours(model, [[(t, start + p, 0, True) for p, t in enumerate(toks)]], N_CTX, 2)[0]
                     for start in (8180, 0))
    # RoPE is relative: before 8191 only the rounding of the angles differs
    before, after = np.abs(far[:11] - near[:11]).max(), np.abs(far[12:] - near[12:]).max()
    assert after > 20 * before, (before, after)


def test_llama4_refuses_what_llama_cpp_cannot_run(tmp_path):
    """``attention.sliding_window`` 0 (llama.cpp aborts on such a model's first decode), no
    ``interleave_moe_layer_step``, a MoE layer without its shared expert: named errors."""
    path = tmp_path / "llama4.gguf"
    write_tiny_llama4(CASES["every-layer-top2"], path, np.random.default_rng(0))
    with pytest.raises(ModelLoadError, match="sliding_window"):
        Model.load(path, kv_overrides={"llama4.attention.sliding_window": 0})
    with pytest.raises(ModelLoadError, match="interleave_moe_layer_step"):
        Model.load(rewrite(path, tmp_path / "a.gguf", drop_keys={"llama4.interleave_moe_layer_step"}))
    with pytest.raises(ModelLoadError, match="blk.1.ffn_up_shexp"):
        Model.load(rewrite(path, tmp_path / "b.gguf", drop_tensors={"blk.1.ffn_up_shexp.weight"}))


def chunked_reference(q, k, v, cell_pos, cell_seq, tok_pos, tok_seq, n_head, n_head_kv, d, scale, chunk):
    """float64 softmax(q k^T * scale) v over the cells of the token's sequence, not in its future,
    from the start of its chunk of ``chunk`` positions on."""
    out = np.zeros((len(q), n_head * d))
    for t in range(len(q)):
        start = tok_pos[t] // chunk * chunk
        idx = np.flatnonzero((cell_seq >> np.uint64(tok_seq[t]) & np.uint64(1)).astype(bool) & (cell_pos >= start)
                             & (cell_pos <= tok_pos[t]))
        for h in range(n_head):
            hk = h // (n_head // n_head_kv)
            s = k[idx, hk * d:(hk + 1) * d].astype(np.float64) @ q[t, h * d:(h + 1) * d] * scale
            p = np.exp(s - s.max())
            out[t, h * d:(h + 1) * d] = (p / p.sum()) @ v[idx, hk * d:(hk + 1) * d].astype(np.float64)
    return out


@pytest.mark.parametrize("cache_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("n_tok", [1, 6])
def test_chunked_attention_is_the_numpy_form(cache_dtype, n_tok):
    """The attention kernel's chunked window (one token, and a batch, which takes the tiled F16
    path): the numpy form's values, the same floats at 1 and 3 threads; without the chunk the
    cells before it count."""
    rng = np.random.default_rng(n_tok)
    n_head, n_head_kv, d, chunk = 4, 2, 32, 16
    # sequence 0 at positions 5..40 (chunks 0, 16 and 32), sequence 1 at 0..11
    cell_pos = np.concatenate([np.arange(5, 41), np.arange(12), [-1] * 4]).astype(np.int32)
    cell_seq = np.concatenate([np.full(36, 1), np.full(12, 2), np.zeros(4)]).astype(np.uint64)
    tok_pos = np.array([40, 31, 32, 16, 11, 5], np.int32)[:n_tok]
    tok_seq = np.array([0, 0, 0, 0, 1, 0], np.int32)[:n_tok]
    q = rng.standard_normal((n_tok, n_head * d)).astype(np.float32)
    k = rng.standard_normal((len(cell_pos), n_head_kv * d)).astype(cache_dtype)
    v = rng.standard_normal((len(cell_pos), n_head_kv * d)).astype(cache_dtype)
    name = "f16" if cache_dtype is np.float16 else "f32"

    def run(n_threads: int, n_swa: int) -> np.ndarray:
        out = np.empty((n_tok, n_head * d), np.float32)
        ops.attention(q, k, name, v, name, len(cell_pos), cell_pos, cell_seq, tok_pos, tok_seq, n_head, n_head_kv, d, d,
                      0.125, out, n_swa=n_swa, n_threads=n_threads, swa_chunked=True)
        return out

    got = run(1, chunk)
    ref = chunked_reference(q, k, v, cell_pos, cell_seq, tok_pos, tok_seq, n_head, n_head_kv, d, 0.125, chunk)
    # an F16 V takes probabilities rounded to fp16 (as ggml does): 2^-11 of each p
    np.testing.assert_allclose(got, ref, rtol=0, atol=5e-4 if cache_dtype is np.float16 else 2e-5)
    np.testing.assert_array_equal(run(3, chunk), got)
    assert np.abs(run(1, 0) - got).max() > 1e-2   # the chunk changes something


@pytest.mark.parametrize("n_tok,n_used", [(1, 1), (7, 1), (7, 3)])
def test_weighted_expert_inputs_are_the_numpy_form(n_tok, n_used):
    """Llama 4's MoE steps: each token's row times the sigmoid weight of each expert it chose,
    in the routing's expert order (every row of an expert together), and the experts' rows summed
    back per token in slot order without weights: the numpy form's floats exactly."""
    from gguflm._ext.plan import Plan
    from gguflm.graph import GATING_SIGMOID

    rng = np.random.default_rng(n_tok * n_used)
    n_expert, n = 5, 48
    logits = rng.standard_normal((n_tok, n_expert)).astype(np.float32) * 3
    x = rng.standard_normal((n_tok, n)).astype(np.float32)
    route = (np.empty((n_tok, n_used), np.int32), np.empty((n_tok, n_used), np.float32),
             np.empty(n_expert + 1, np.int32), np.empty(n_tok * n_used, np.int32), np.empty(n_tok * n_used, np.int32))
    rows, out = np.empty((n_tok * n_used, n), np.float32), np.empty((n_tok, n), np.float32)
    plan = Plan(n_tok, n_tok, 1)
    plan.moe_route(logits, n_expert, n_used, GATING_SIGMOID, False, 0.0, route)
    plan.moe_gather_weighted(x, route, n_expert, n_used, rows)
    plan.moe_combine(rows, route, n_used, out, False)
    plan.run()
    ids, weights, offsets, src, slot = route
    chosen = np.argsort(-logits, axis=1, kind="stable")[:, :n_used]
    np.testing.assert_array_equal(ids, chosen)
    sig = (np.float32(1) / (np.float32(1) + np.exp(-logits))).astype(np.float32)
    np.testing.assert_allclose(weights, np.take_along_axis(sig, chosen, 1), rtol=1e-6)   # libm's expf
    expect = np.empty_like(rows)
    for e in range(n_expert):
        for r in range(offsets[e], offsets[e + 1]):
            t = src[r]
            assert e in ids[t]
            expect[r] = x[t] * weights[t, list(ids[t]).index(e)]
    np.testing.assert_array_equal(rows, expect)
    summed = rows[slot.reshape(n_tok, n_used)[:, 0]].copy()
    for i in range(1, n_used):
        summed = summed + rows[slot.reshape(n_tok, n_used)[:, i]]
    np.testing.assert_array_equal(out, summed)
