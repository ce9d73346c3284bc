"""Gemma 3n (``gemma3n``, text) against llama.cpp, and its own steps against numpy forms.

Tiny random models (tests/tiny_models.py's :class:`TinyGemma3n`, weight types mixed per tensor)
give llama.cpp's logits (llama-cpp-python) to the bit at every position: in ubatches of 1 and
the whole prompt, at 1 to 3 threads, with several sequences in one batch and after a seq_rm and a
K shift. llama.cpp fixes Gemma 3n's shapes (AltUp's 4 streams, per-layer inputs of 256, the first
ten layers sparse, the layers from the 20th on sharing the K and V of layer 18 or 19): the model
of 22 layers has both window kinds among its sharing layers and layers past the sparse ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import gguflm
from _llama import L, LlamaDecoder, require_peer
from _memory_pair import MemoryPair, decode_entries
from gguflm import Context, Model
from gguflm._ext.plan import ALTUP_KINDS, ALTUP_N, Plan
from gguflm.errors import ModelLoadError
from gguflm.ggml_types import GGMLType
from gguflm.models import architectures, get_architecture
from test_gemma_family import check_given_embeddings
from test_invariance import llama_cpp_logits, prompt_logits
from tiny_models import TinyGemma3n, tiny_gemma3n_models, write_tiny_gemma3n

F32 = np.float32
PROMPT = [1] + list(range(20, 37))
MIXED = {"attn_q": GGMLType.Q8_0, "attn_k": GGMLType.Q4_0, "attn_v": GGMLType.Q5_1, "attn_output": GGMLType.Q5_0,
         "ffn_gate": GGMLType.IQ4_NL, "ffn_up": GGMLType.Q8_0, "ffn_down": GGMLType.Q4_K, "token_embd": GGMLType.Q5_0,
         "per_layer_token_embd": GGMLType.Q4_K, "per_layer_model_proj": GGMLType.Q8_0, "inp_gate": GGMLType.Q4_0,
         "proj": GGMLType.Q6_K, "laurel_l": GGMLType.Q8_0, "laurel_r": GGMLType.BF16, "altup_proj": GGMLType.Q8_0,
         "altup_unembd_proj": GGMLType.F32, "altup_router": GGMLType.F32, "altup_predict_coef": GGMLType.F32}
CASES = {
    # every other layer global: layers 20 (sliding) and 21 (global) share the caches of 18 and 19
    "shared-kv-mixed": TinyGemma3n(n_layer=22, n_ff=256, swa=tuple(il % 2 == 0 for il in range(22)), types=MIXED,
                                   tied_output=False),
    # the default pattern (layer 4 global), four query heads to two KV heads of 16
    "default-pattern": TinyGemma3n(n_embd=96, head_dim=16, n_head=4, n_head_kv=2, n_layer=6, n_swa=3),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def gemma3n(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3n") / "gemma3n.gguf"
    write_tiny_gemma3n(CASES[request.param], path, np.random.default_rng(3))
    with Model.load(path) as model:
        yield path, model


def test_gemma3n_gives_llama_cpps_logits(gemma3n):
    """Every position, in ubatches of 1 and the whole prompt: llama.cpp's logits to the bit, the
    same floats at 1 and 3 threads."""
    require_peer()
    path, model = gemma3n
    for n_ubatch in (1, len(PROMPT)):
        ours = prompt_logits(model, PROMPT, 2, n_ubatch, "f16", "f16")
        np.testing.assert_array_equal(ours, llama_cpp_logits(path, PROMPT, n_ubatch, "f16", "f16"),
                                      err_msg=f"ubatch {n_ubatch}")
        for n_threads in (1, 3) if n_ubatch > 1 else (1,):
            np.testing.assert_array_equal(prompt_logits(model, PROMPT, n_threads, n_ubatch, "f16", "f16"), ours)


@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(spec=tiny_gemma3n_models())
def test_drawn_gemma3n_models_give_llama_cpps_logits(tmp_path_factory, spec):
    """Drawn widths, heads, window flags and weight types: llama.cpp's logits to the bit."""
    require_peer()
    path = tmp_path_factory.mktemp("drawn") / "gemma3n.gguf"
    write_tiny_gemma3n(spec, path, np.random.default_rng(1))
    with Model.load(path) as model:
        np.testing.assert_array_equal(prompt_logits(model, PROMPT, 2, len(PROMPT), "f16", "f16"),
                                      llama_cpp_logits(path, PROMPT, len(PROMPT), "f16", "f16"))


def test_gemma3n_several_sequences_seq_rm_and_a_k_shift(gemma3n):
    """Two sequences in one batch, then seq_rm and a K shift, then decoding on: llama.cpp's logits."""
    path, _ = gemma3n
    a, b = PROMPT[:11], PROMPT[4:13]
    steps = [[(t, p, 0, True) for p, t in enumerate(a)] + [(t, p, 1, True) for p, t in enumerate(b)],
             [(40, 11, 0, True), (41, 9, 1, True)], [(42, 9, 0, True), (43, 10, 0, True), (44, 10, 1, True)]]
    with MemoryPair(path, n_seq=2) as both:
        both.decode(steps[0])
        both.decode(steps[1])
        both.seq_rm(0, 6, 9)
        both.seq_add(0, 9, -1, -3)
        both.decode(steps[2])


def test_gemma3n_is_registered_and_loads_through_llm(gemma3n):
    """The registry has it by llama.cpp's name (the README's list is the registry's)."""
    path, model = gemma3n
    assert "gemma3n" in architectures() and get_architecture("gemma3n").name == "gemma3n"
    with gguflm.LLM(path, n_threads=2, progress=False) as llm:
        assert llm.model.hparams.arch == "gemma3n"


def test_gemma3n_given_embeddings_take_the_padding_tokens_per_layer_inputs(tmp_path):
    """Rows given in place of tokens: unscaled, their per-layer inputs the padding token's (id 0)."""
    require_peer()
    path = tmp_path / "gemma3n.gguf"
    write_tiny_gemma3n(CASES["default-pattern"], path, np.random.default_rng(4))
    check_given_embeddings(path, 96)


def test_a_control_vector_joins_every_stream(gemma3n):
    """A control vector on layers 1 .. n_layer - 1 is added to all of AltUp's streams, as
    llama.cpp's build_cvec adds it to the block's 3-D output: the logits are llama.cpp's."""
    import ctypes

    path, model = gemma3n
    hp = model.hparams
    data = (0.5 * np.random.default_rng(6).standard_normal(hp.n_embd * hp.n_layer)).astype(F32)
    peer = LlamaDecoder(path, n_ctx=256, n_threads=2, n_batch=64)
    try:
        assert L.llama_set_adapter_cvec(peer._ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), len(data),
                                        hp.n_embd, 1, hp.n_layer - 1) == 0
        theirs = np.concatenate([peer.decode(PROMPT[:8], 0), peer.decode(PROMPT[8:9], 8)])
    finally:
        peer.close()
    with Context(model, n_ctx=256, n_batch=64, n_threads=2) as ctx:
        ctx.set_adapter_cvec(data, hp.n_embd, 1, hp.n_layer - 1)
        ours = [decode_entries(ctx, [(t, k, 0, True) for k, t in enumerate(PROMPT[:8])]),
                decode_entries(ctx, [(PROMPT[8], 8, 0, True)])]
    np.testing.assert_array_equal(np.concatenate(ours), theirs)


def test_a_shared_cache_of_another_kind_is_refused(tmp_path):
    """Layer 20 (sliding) would share layer 18's cache, which is global: a clear error, as for Gemma 4."""
    path = tmp_path / "gemma3n.gguf"
    swa = [il % 2 == 1 for il in range(21)]
    write_tiny_gemma3n(TinyGemma3n(n_layer=21, swa=tuple(swa[:20] + [True])), path, np.random.default_rng(0))
    with pytest.raises(ModelLoadError, match="layer 20 would share"):
        Model.load(path)


# -- the steps of altup.h against numpy forms (float32 rounding as ggml's ops; sums in float64)

def _run(kind: str, out: np.ndarray, n_threads: int = 1, **kw) -> np.ndarray:
    plan = Plan(out.shape[-2], 1, 1)
    plan.altup(ALTUP_KINDS[kind], out, n_threads, **kw)
    plan.run()
    return out


def _magnitude(x: np.ndarray) -> np.ndarray:
    return np.sqrt(((x * x).astype(np.float64).sum(axis=1)).astype(F32))[:, None]


@pytest.mark.parametrize("n_threads", [1, 3])
def test_rescale_and_topk_are_their_numpy_forms(n_threads):
    rng = np.random.default_rng(0)
    target, rows = rng.standard_normal((2, 9, 70)).astype(F32) * F32(3)
    out = _run("rescale", rows.copy(), n_threads, x=target)
    np.testing.assert_array_equal(out, (rows * _magnitude(target)) / _magnitude(rows))
    x = rng.standard_normal((9, 70)).astype(F32)
    mean = (x.astype(np.float64).sum(axis=1).astype(F32) / F32(70))[:, None]
    d = x - mean
    std = np.sqrt((d * d).astype(np.float64).sum(axis=1).astype(F32) * (F32(1) / F32(69)))[:, None]
    cutoff = mean + std * F32(1.6448533535003662)
    out = _run("topk", x.copy(), n_threads, f=1.6448533535003662)
    np.testing.assert_array_equal(out, np.maximum(x - cutoff, F32(0)))
    assert 0 < (out > 0).mean() < 0.2   # about the top 5 % of each row stays


def test_predict_and_correct_are_their_numpy_forms():
    """AltUp's mixes of the 4 streams (their 4-term dots to within fused rounding)."""
    rng = np.random.default_rng(1)
    n, e = 7, 40
    stack = rng.standard_normal((ALTUP_N, n, e)).astype(F32)
    coefs = rng.standard_normal((n, ALTUP_N * ALTUP_N)).astype(F32)
    out = np.empty_like(stack)
    _run("predict", out[0], x=stack[0], y=coefs, slice=n * e)
    mix = np.einsum("kte,tjk->jte", stack.astype(np.float64), coefs.reshape(n, ALTUP_N, ALTUP_N).astype(np.float64))
    np.testing.assert_allclose(out, stack + mix, rtol=0, atol=3e-6)
    active = rng.standard_normal((n, e)).astype(F32)
    c = rng.standard_normal((n, ALTUP_N)).astype(F32)
    out = np.empty_like(stack)
    _run("correct", out[0], x=stack[0], y=c, w=active, slice=n * e)
    expected = (active - stack[0])[None] * (c.T[:, :, None] + F32(1)) + stack
    np.testing.assert_array_equal(out, expected)
