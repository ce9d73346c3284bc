"""The newer Gemma family against llama.cpp: EmbeddingGemma (``gemma-embedding``), Gemma 4's
dense text stack (``gemma4``), and what Gemma 3 on do with embeddings given in place of tokens.

Tiny random models (tests/tiny_models.py's :class:`TinyGemma`, weight types mixed per tensor)
give llama.cpp's embeddings (llama-cpp-python) to the bit, for every pooling, several sequences in
one batch, at 1 to 4 threads, through a Context, ``gguflm.LLM.embed`` and the llama-cpp-python
shim. EmbeddingGemma is an encoder (no KV cache): llama.cpp runs a batch as one ubatch, so there
is no ubatch size to vary. Its sliding-window layers see n_swa / 2 positions either way: the
attention kernel's symmetric window is checked against a float64 numpy form.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gguflm
import gguflm.llama_cpp as shim
from _llama import L, LlamaDecoder, llama_embeddings, require_peer
from _memory_pair import MemoryPair
from gguflm import Batch, Context, Model
from gguflm._ext import ops
from gguflm.errors import ModelLoadError
from gguflm.hparams import HParamReader
from gguflm.loader import MissingTensorError
from gguflm.models.gemma4 import Gemma4
from gguflm.ggml_types import GGMLType
from gguflm.gguf import GGUFReader
from gguflm.pooling import pooling_type
from test_embeddings import bits_equal, context_embeddings
from test_invariance import llama_cpp_logits, prompt_logits
from tiny_models import TinyGemma, TinyModel, tiny_gemma4_models, tiny_gemma_embeddings, write_tiny_gemma, write_tiny_model

F32 = np.float32
# lengths past the windows (n_swa / 2 either way) and of no whole vector of lanes, so ggml's tails run
SEQS = [[1] + list(range(20, 33)), [1] + list(range(40, 47)), [1] + list(range(60, 79))]
TEXTS = ["p1 p2 p3 p4 p5 p6 p7 p8 p9", "p10 p11", "p3 p5 p7 p11 p13 p17 p19 p23 p29 p31 p37 p41"]

MIXED = {"attn_q": GGMLType.Q8_0, "attn_k": GGMLType.Q4_K, "attn_v": GGMLType.Q6_K, "attn_output": GGMLType.Q4_0,
         "ffn_gate": GGMLType.Q5_K, "ffn_up": GGMLType.IQ4_NL, "ffn_down": GGMLType.Q8_0, "token_embd": GGMLType.Q6_K,
         "dense_2": GGMLType.Q8_0, "dense_3": GGMLType.BF16}
EMBEDDING_CASES = {
    "dense-mixed": TinyGemma(n_embd=256, head_dim=64, n_dense=384, types=MIXED),
    "no-dense": TinyGemma(n_layer=4, swa_period=3, n_swa=9),
    "gqa-4-heads-of-16": TinyGemma(n_embd=96, head_dim=16, n_head=4, n_head_kv=1, n_swa=4, n_dense=32,
                                   tensor_types={"blk.1.attn_k.weight": GGMLType.F32}),
}


def _written_and_loaded(tmp_path_factory, spec: TinyGemma, name: str, seed: int):
    """The spec written with random weights of this seed, then loaded: (path, model) until the module ends."""
    path = tmp_path_factory.mktemp(name) / f"{name}.gguf"
    write_tiny_gemma(spec, path, np.random.default_rng(seed))
    with Model.load(path) as model:
        yield path, model


@pytest.fixture(scope="module", params=sorted(EMBEDDING_CASES))
def embedding_gemma(request, tmp_path_factory):
    yield from _written_and_loaded(tmp_path_factory, EMBEDDING_CASES[request.param], "gemma-embedding", 5)


def test_embedding_gemma_equals_llama_cpp(embedding_gemma):
    """Three sequences in one batch, every pooling: llama.cpp's floats, at 1 to 4 threads."""
    require_peer()
    path, model = embedding_gemma
    for pooling in ("none", "mean", "cls", "last"):
        theirs = np.concatenate(llama_embeddings(path, SEQS, int(pooling_type(pooling))))
        for n_threads in (1, 2, 3, 4) if pooling == "none" else (2,):
            ours = context_embeddings(model, SEQS, pooling, n_threads=n_threads, n_threads_batch=n_threads)
            assert bits_equal(np.concatenate(ours), theirs), f"{pooling}, {n_threads} threads"


@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(spec=tiny_gemma_embeddings())
def test_drawn_embedding_gemmas_equal_llama_cpp(tmp_path, spec):
    """Drawn shapes and weight types: llama.cpp's token rows and mean-pooled vectors to the bit."""
    require_peer()
    path = tmp_path / "gemma-embedding.gguf"
    write_tiny_gemma(spec, path, np.random.default_rng(1))
    with Model.load(path) as model:
        for pooling in ("none", "mean"):
            theirs = llama_embeddings(path, SEQS, int(pooling_type(pooling)))
            ours = context_embeddings(model, SEQS, pooling, n_threads=2, n_threads_batch=2)
            assert bits_equal(np.concatenate(ours), np.concatenate(theirs)), pooling


def test_embedding_gemma_through_llm_and_the_shim(tmp_path):
    """``gguflm.LLM.embed`` and the shim's ``Llama.embed`` give llama-cpp-python's ``Llama.embed``."""
    llama_cpp = require_peer()
    path = tmp_path / "gemma-embedding.gguf"
    write_tiny_gemma(EMBEDDING_CASES["dense-mixed"], path, np.random.default_rng(6))
    peer = llama_cpp.Llama(str(path), embedding=True, n_threads=2, n_threads_batch=2, verbose=False)
    try:
        theirs = peer.embed(TEXTS)
    finally:
        peer.close()
    with gguflm.LLM(path, embedding=True, n_threads=2, progress=False) as llm:
        assert bits_equal(llm.embed(TEXTS), theirs)
    ours = shim.Llama(str(path), embedding=True, n_threads=2, n_threads_batch=2, verbose=False)
    try:
        assert bits_equal(ours.embed(TEXTS), theirs)
    finally:
        ours.close()


def test_embedding_gemma_is_an_encoder(tmp_path):
    """No text generation, no batch over two ubatches (llama.cpp asserts there)."""
    path = tmp_path / "gemma-embedding.gguf"
    write_tiny_gemma(TinyGemma(n_dense=32), path, np.random.default_rng(0))
    with pytest.raises(gguflm.Error, match="encoder"):
        gguflm.LLM(path, progress=False)
    with Model.load(path) as model:
        assert not model.hparams.causal_attn and model.hparams.swa_symmetric
        ctx = gguflm.Context(model, n_ctx=64, n_batch=64, n_ubatch=8, embeddings=True)
        batch = gguflm.Batch(12)
        for i in range(12):
            batch.add(3 + i, i, [0], True)
        assert ctx.decode(batch) == -1
        ctx.close()


def window_reference(q, k, v, pos, seq, n_head, n_head_kv, d, scale, n_swa):
    """float64 softmax(q k^T * scale) v over the cells of the token's sequence within n_swa / 2
    positions either way."""
    out = np.zeros((q.shape[0], n_head * d))
    for h in range(n_head):
        hk = h // (n_head // n_head_kv)
        for t in range(q.shape[0]):
            idx = np.flatnonzero((seq == seq[t]) & (np.abs(pos - pos[t]) <= n_swa // 2))
            s = k[idx, hk * d:(hk + 1) * d].astype(np.float64) @ q[t, h * d:(h + 1) * d] * scale
            p = np.exp(s - s.max())
            out[t, h * d:(h + 1) * d] = (p / p.sum()) @ v[idx, hk * d:(hk + 1) * d]
    return out


@pytest.mark.parametrize("lengths,n_swa,n_head,n_head_kv", [((9, 23), 4, 4, 2), ((31,), 7, 2, 1), ((5, 3), 64, 2, 2)])
def test_symmetric_window_attention_is_the_numpy_form(lengths, n_swa, n_head, n_head_kv):
    """The no-cache attention kernel with a symmetric window: the numpy form's values, the same
    floats at 1 and 3 threads; a window wider than the sequences is no window."""
    rng = np.random.default_rng(n_swa)
    d = 32
    seq = np.concatenate([np.full(n, s, np.int32) for s, n in enumerate(lengths)])
    pos = np.concatenate([np.arange(n, dtype=np.int32) for n in lengths])
    q = rng.standard_normal((len(seq), n_head * d)).astype(F32)
    k = rng.standard_normal((len(seq), n_head_kv * d)).astype(F32)
    v = rng.standard_normal((len(seq), n_head_kv * d)).astype(F32)
    scale = float(F32(1) / np.sqrt(F32(d)))

    def run(n_threads: int, n_swa: int) -> np.ndarray:
        out = np.empty((len(seq), n_head * d), F32)
        ops.attention(q, k, "f32", v, "f32", len(pos), pos, np.zeros(0, np.uint64), pos, seq, n_head, n_head_kv, d, d,
                      scale, out, causal=False, n_swa=n_swa, n_threads=n_threads, cell_seq_id=seq, n_cols=len(pos),
                      swa_symmetric=True)
        return out

    ours = run(1, n_swa)
    np.testing.assert_allclose(ours, window_reference(q, k, v, pos, seq, n_head, n_head_kv, d, scale, n_swa),
                               rtol=0, atol=3e-5)
    np.testing.assert_array_equal(run(3, n_swa), ours)
    if n_swa // 2 >= max(lengths):
        np.testing.assert_allclose(ours, run(1, 0), rtol=0, atol=1e-6)
    else:   # the window changes something
        assert np.abs(ours - run(1, 0)).max() > 1e-3


def test_dense_projections_must_start_and_end_at_n_embd(tmp_path):
    """As llama.cpp asserts of dense_2_feat_in and dense_3_feat_out."""
    path = tmp_path / "gemma-embedding.gguf"
    write_tiny_gemma(TinyGemma(n_dense=32), path, np.random.default_rng(0))
    with Model.load(path) as model:
        assert {"dense_2.weight", "dense_3.weight"} <= set(model.tensors)
    for key in ("dense_2_feat_in", "dense_3_feat_out"):
        with pytest.raises(ModelLoadError, match=key):
            Model.load(path, kv_overrides={f"gemma-embedding.{key}": 48})


def llama_cpp_embd_logits(path: Path, rows: np.ndarray) -> np.ndarray:
    """llama.cpp's logits of a batch of embedding rows (sequence 0 at positions 0..), every row an output."""
    peer = LlamaDecoder(path)
    batch = L.llama_batch_init(len(rows), rows.shape[1], 1)
    try:
        np.ctypeslib.as_array(batch.embd, shape=(rows.size,))[:] = rows.ravel()
        for k in range(len(rows)):
            batch.pos[k], batch.n_seq_id[k], batch.logits[k] = k, 1, True
            batch.seq_id[k][0] = 0
        batch.n_tokens = len(rows)
        assert L.llama_decode(peer._ctx, batch) == 0
        return np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(peer._ctx, k), shape=(peer.n_vocab,))
                         for k in range(len(rows))]).copy()
    finally:
        L.llama_batch_free(batch)
        peer.close()


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_given_embeddings_are_scaled_as_llama_cpp_scales_them(tmp_path, arch):
    """Rows given in place of tokens: Gemma 2 scales them by sqrt(n_embd) as it scales looked-up
    ones, Gemma 3 takes them as they are (llama.cpp's ``ubatch.token ? sqrtf(n_embd) : 1``)."""
    require_peer()
    path = tmp_path / f"{arch}.gguf"
    write_tiny_model(TinyModel(arch, n_embd=64, head_dim=16, n_head=4, n_head_kv=2, n_ff=64, n_swa=4,
                               tied_output=arch == "gemma2"), path, np.random.default_rng(2))
    rows = np.random.default_rng(3).standard_normal((9, 64)).astype(F32)
    theirs = llama_cpp_embd_logits(path, rows)
    with Model.load(path) as model, Context(model, n_ctx=256, n_threads=2, n_threads_batch=2) as ctx:
        batch = Batch(len(rows), embd=64)
        for k, row in enumerate(rows):
            batch.add(row, k, [0], True)
        assert ctx.decode(batch) == 0
        np.testing.assert_array_equal(ctx.get_logits(), theirs)


# -- Gemma 4

GEMMA4_MIXED = {"attn_q": GGMLType.Q8_0, "attn_k": GGMLType.Q4_0, "attn_v": GGMLType.Q5_1, "attn_output": GGMLType.Q5_0,
                "ffn_gate": GGMLType.Q6_K, "ffn_up": GGMLType.IQ4_NL, "ffn_down": GGMLType.Q4_K,
                "token_embd": GGMLType.Q8_0, "output": GGMLType.Q6_K}
GEMMA4_CASES = {
    # global heads twice the sliding ones, as Gemma 4's 512 and 256; a layer whose V is its K
    "two-head-sizes": TinyGemma("gemma4", n_embd=64, head_dim=32, head_dim_swa=16, n_rot=16, n_layer=4, n_swa=5,
                                no_v_layers=(1,), tied_output=False),
    # and one KV head per layer as the files give it, four in sliding layers, two in the global one
    "mixed-types": TinyGemma("gemma4", n_embd=256, head_dim=64, head_dim_swa=32, n_head=4, n_head_kv=4, n_ff=256,
                             n_layer=3, swa_period=3, n_swa=4, n_rot_swa=16, no_v_layers=(2,), n_head_kv_global=2,
                             types=GEMMA4_MIXED),
    "tied-one-kind": TinyGemma("gemma4", n_embd=48, head_dim=16, n_head=3, n_head_kv=1, n_layer=2, swa_period=2,
                               n_swa=3),
    # the last two layers attend over the cached K and V of layers 2 (sliding) and 3 (global)
    # and per-layer inputs, as E2B and E4B
    "kv-sharing-ple": TinyGemma("gemma4", n_embd=64, head_dim=32, head_dim_swa=16, n_layer=6, swa_period=2, n_swa=4,
                                n_shared_kv=2, no_v_layers=(3,), n_ple=16,
                                types={"per_layer_token_embd": GGMLType.Q8_0, "inp_gate": GGMLType.Q4_0}),
}
PROMPT = [1] + list(range(20, 37))


@pytest.fixture(scope="module", params=sorted(GEMMA4_CASES))
def gemma4(request, tmp_path_factory):
    yield from _written_and_loaded(tmp_path_factory, GEMMA4_CASES[request.param], "gemma4", 8)


def test_gemma4_gives_llama_cpps_logits(gemma4):
    """Every position, in ubatches of 1, 5 and the whole prompt: llama.cpp's logits to the bit,
    the same floats at 1 to 4 threads."""
    require_peer()
    path, model = gemma4
    for n_ubatch in (1, 5, len(PROMPT)):
        ours = prompt_logits(model, PROMPT, 2, n_ubatch, "f16", "f16")
        np.testing.assert_array_equal(ours, llama_cpp_logits(path, PROMPT, n_ubatch, "f16", "f16"),
                                      err_msg=f"ubatch {n_ubatch}")
        for n_threads in (1, 3, 4) if n_ubatch == 5 else ():
            np.testing.assert_array_equal(prompt_logits(model, PROMPT, n_threads, n_ubatch, "f16", "f16"), ours)


@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(spec=tiny_gemma4_models())
def test_drawn_gemma4_models_give_llama_cpps_logits(tmp_path, spec):
    """Drawn head sizes, rotations, KV heads, layers without V and weight types: llama.cpp's
    logits to the bit in ubatches of 1, 5 and the whole prompt."""
    require_peer()
    path = tmp_path / "gemma4.gguf"
    write_tiny_gemma(spec, path, np.random.default_rng(1))
    with Model.load(path) as model:
        for n_ubatch in (1, 5, len(PROMPT)):
            np.testing.assert_array_equal(prompt_logits(model, PROMPT, 2, n_ubatch, "f16", "f16"),
                                          llama_cpp_logits(path, PROMPT, n_ubatch, "f16", "f16"),
                                          err_msg=f"ubatch {n_ubatch}")


def test_gemma4_reads_a_real_files_hyper_parameters(vocab_dir):
    """The 26B-A4B's metadata (tests/data/vocab): with its experts overridden away, the load gets
    past the hyper-parameters (per-layer KV heads, the window flags, both head sizes) to the
    tensors the vocabulary file lacks."""
    path = vocab_dir / "ggml-vocab-gemma-4.gguf"
    with pytest.raises(MissingTensorError):
        Model.load(path, kv_overrides={"gemma4.expert_count": 0})
    with GGUFReader(path) as r:
        meta = r.metadata
    hp = Gemma4.read_hparams(HParamReader("gemma4", {**meta, "gemma4.expert_count": 0}, path.name), 262144)
    assert [hp.head_k(il) for il in (0, 5)] == [meta["gemma4.attention.key_length_swa"], meta["gemma4.attention.key_length"]]
    assert list(hp.n_head_kv) == list(meta["gemma4.attention.head_count_kv"])
    assert [hp.rot(il) for il in (0, 5)] == [meta["gemma4.rope.dimension_count_swa"], meta["gemma4.rope.dimension_count"]]


def test_gemma4_several_sequences_and_a_k_shift(gemma4):
    """Two sequences in one batch, then seq_rm and a K shift (each layer's K re-rotated over its
    own rotated dimensions, the global layers with rope_freqs), then decoding on."""
    path, _ = gemma4
    a, b = PROMPT[:11], PROMPT[4:13]
    steps = [[(t, p, 0, True) for p, t in enumerate(a)] + [(t, p, 1, True) for p, t in enumerate(b)],
             [(40, 11, 0, True), (41, 9, 1, True)], [(42, 9, 0, True), (43, 10, 0, True)]]
    with MemoryPair(path, n_seq=2) as both:
        both.decode(steps[0])
        both.decode(steps[1])
        both.seq_rm(0, 6, 9)
        both.seq_add(0, 9, -1, -3)
        both.decode(steps[2])


@pytest.mark.parametrize("key,value", [("attention.shared_kv_layers", 1),
                                       ("attention.sliding_window_pattern", 2)])
def test_gemma4_files_with_what_is_not_implemented_are_refused(tmp_path, key, value):
    path = tmp_path / "gemma4.gguf"
    write_tiny_gemma(GEMMA4_CASES["tied-one-kind"], path, np.random.default_rng(0))
    with pytest.raises(ModelLoadError, match=key.split(".")[-1]):
        Model.load(path, kv_overrides={f"gemma4.{key}": value})


def test_gemma4_given_embeddings_take_the_padding_tokens_per_layer_inputs(tmp_path):
    """Rows given in place of tokens: unscaled, and every one's per-layer inputs from the padding
    token (id 0), as llama.cpp's Gemma 4 graph takes them."""
    require_peer()
    path = tmp_path / "gemma4.gguf"
    write_tiny_gemma(GEMMA4_CASES["kv-sharing-ple"], path, np.random.default_rng(4))
    check_given_embeddings(path, 64)


def check_given_embeddings(path: Path, n_embd: int) -> None:
    """Seven random rows given in place of tokens, one sequence: llama.cpp's logits, bit for bit."""
    rows = np.random.default_rng(5).standard_normal((7, n_embd)).astype(F32)
    theirs = llama_cpp_embd_logits(path, rows)
    with Model.load(path) as model, Context(model, n_ctx=256, n_threads=2, n_threads_batch=2) as ctx:
        batch = Batch(len(rows), embd=n_embd)
        for k, row in enumerate(rows):
            batch.add(row, k, [0], True)
        assert ctx.decode(batch) == 0
        np.testing.assert_array_equal(ctx.get_logits(), theirs)
