"""Same floats at every thread count: tiny random models of every architecture, every weight type
mixed per tensor, every KV cache type, decoded at 1 to 4 threads and in ubatches of 1, an odd
size and the whole prompt.

For one ubatch size the logits must be bit-identical at every thread count, and never NaN. Across
ubatch sizes they need not be: llama.cpp's kernels depend on the batch width (single tokens take
vec_dot, batches sgemm or tiled GEMMs, Q4_K groups of 4 tokens the repacked GEMM), so its own
logits move when a prompt is split differently, and ours are its logits for each split (compared
here with llama.cpp itself, when llama-cpp-python is installed, with the tolerance of the
architecture tests). CI draws a dozen models; ``pytest --hypothesis-profile soak`` draws as many
as that profile says (tests/conftest.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from _llama import PEER_REQUIRED, peer_problem, require_peer
from gguflm import Batch, Context, Model
from gguflm.ggml_types import GGMLType
from tiny_models import N_VOCAB, TinyModel, tiny_models, write_tiny_model


THREADS = (1, 2, 3, 4)
CACHE_TYPES = ("f32", "f16", "q8_0")
GGML_CACHE_TYPE_IDS = {"f32": 0, "f16": 1, "q8_0": 8}
EXAMPLES = 12 if settings.default.max_examples <= 100 else settings.default.max_examples


def prompt_logits(model: Model, tokens: list[int], n_threads: int, n_ubatch: int, type_k: str,
                  type_v: str) -> np.ndarray:
    """Logits [n_tokens, n_vocab] of the prompt decoded in one call, every position an output."""
    with Context(model, n_ctx=256, n_batch=len(tokens), n_ubatch=n_ubatch, n_threads=n_threads,
                 n_threads_batch=n_threads, type_k=type_k, type_v=type_v) as ctx:
        batch = Batch(len(tokens))
        for pos, tok in enumerate(tokens):
            batch.add(tok, pos, [0], True)
        assert ctx.decode(batch) == 0
        return ctx.get_logits().copy()


def llama_cpp_logits(path: Path, tokens: list[int], n_ubatch: int, type_k: str, type_v: str) -> np.ndarray:
    llm = require_peer().Llama(str(path), n_ctx=256, n_batch=len(tokens), n_ubatch=n_ubatch, n_threads=2,
                          n_threads_batch=2, type_k=GGML_CACHE_TYPE_IDS[type_k],
                          type_v=GGML_CACHE_TYPE_IDS[type_v], logits_all=True, verbose=False)
    try:
        llm.eval(tokens)
        return np.asarray(llm.scores[:len(tokens)], dtype=np.float32)
    finally:
        llm.close()


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / (b.max() - b.min()))


def check_logits_against_llama_cpp(model: Model, path: Path, tokens: list[int]) -> None:
    """One token per ubatch and the whole prompt in one: the same floats at 1 and 2 threads, and
    llama.cpp's logits within the loose tolerance of models whose routing or latent rounding
    differs (relative error < 0.02, 90% of the argmaxes)."""
    for n_ubatch in (1, len(tokens)):
        ours = prompt_logits(model, tokens, 1, n_ubatch, "f16", "f16")
        assert np.isfinite(ours).all()
        other = prompt_logits(model, tokens, 2, n_ubatch, "f16", "f16")
        assert (other.view(np.uint32) == ours.view(np.uint32)).all(), f"2 threads, ubatch {n_ubatch}"
        theirs = llama_cpp_logits(path, tokens, n_ubatch, "f16", "f16")
        assert rel_err(ours, theirs) < 0.02, f"ubatch {n_ubatch}"
        assert (ours.argmax(1) == theirs.argmax(1)).mean() >= 0.9, f"ubatch {n_ubatch}"


def cache_types(spec: TinyModel) -> st.SearchStrategy[tuple[str, str]]:
    """K and V cache types; a Q8_0 cache needs whole blocks per head, as llama.cpp requires."""
    allowed = [t for t in CACHE_TYPES if t != "q8_0" or spec.head_dim % 32 == 0]
    return st.tuples(st.sampled_from(allowed), st.sampled_from(allowed))


@st.composite
def cases(draw: st.DrawFn) -> tuple[TinyModel, tuple[str, str], list[int], int, int]:
    spec = draw(tiny_models())
    n_prompt = draw(st.integers(6, 24))
    tokens = [1] + draw(st.lists(st.integers(3, N_VOCAB - 2), min_size=n_prompt - 1, max_size=n_prompt - 1))
    return spec, draw(cache_types(spec)), tokens, draw(st.sampled_from((3, 5, 7))), draw(st.integers(0, 2**32 - 1))


# the architectures added with mixtures of experts, each at least once per run (small shapes; the
# strategy draws them, and all the others, at random too)
EXTRA_EXAMPLES = [
    TinyModel("llama", n_embd=64, head_dim=16, n_head=4, n_head_kv=2, n_ff=32, n_layer=2, n_expert=20,
              n_expert_used=2, router="zero"),
    TinyModel("qwen2moe", n_embd=64, head_dim=16, n_head=4, n_head_kv=1, n_ff=64, n_layer=1, n_expert=8,
              n_expert_used=3, n_ff_exp=32, tied_output=False, router="pairs"),
    TinyModel("qwen3moe", n_embd=64, head_dim=32, n_head=2, n_head_kv=1, n_ff=64, n_layer=1, n_expert=4,
              n_expert_used=4, n_ff_exp=48),
    TinyModel("olmoe", n_embd=64, head_dim=16, n_head=4, n_head_kv=4, n_ff=32, n_layer=1, n_expert=40,
              n_expert_used=1, tied_output=False, router="zero"),
    TinyModel("granitemoe", n_embd=64, head_dim=16, n_head=4, n_head_kv=2, n_ff=32, n_layer=1, n_expert=8,
              n_expert_used=2, n_ff_shexp=32),
    TinyModel("gpt-oss", n_embd=64, head_dim=16, n_head=4, n_head_kv=2, n_ff=64, n_layer=2, n_expert=8,
              n_expert_used=2, n_ff_exp=32, tied_output=False, n_swa=3, router="pairs"),
    TinyModel("dots1", n_embd=64, head_dim=16, n_head=4, n_head_kv=4, n_ff=64, n_layer=2, n_expert=8,
              n_expert_used=2, n_ff_exp=32, tied_output=False, router="pairs", n_dense_lead=1,
              metadata={"expert_gating_func": 2, "expert_weights_norm": True, "expert_weights_scale": 2.5}),
] + [TinyModel(arch, n_embd=64, head_dim=16, n_head=4, n_head_kv=2, n_ff=64, n_layer=4 if arch in ("smollm3", "cohere2") else 2,
               tied_output=arch in ("gemma", "command-r", "cohere2"), parallel=arch in ("stablelm", "gptneox"))
     for arch in ("granite", "gemma", "olmo2", "smollm3", "starcoder2", "phi2", "command-r", "stablelm",
                  "ernie4_5", "seed_oss", "glm4", "exaone4", "gpt2", "starcoder", "internlm2", "cohere2", "olmo", "gptneox",
                  "falcon")] + [
    # Baichuan rotates Q and K only with 32 layers (7B); other counts use no positions
    TinyModel("baichuan", n_embd=32, head_dim=8, n_head=4, n_head_kv=4, n_ff=32, n_layer=32, tied_output=False),
    # EXAONE 4 slides (and drops RoPE on its global layers) only with 64 layers
    TinyModel("exaone4", n_embd=32, head_dim=8, n_head=4, n_head_kv=2, n_ff=32, n_layer=64, n_swa=3),
    TinyModel("qwen", n_embd=64, head_dim=16, n_head=4, n_head_kv=4, n_ff=64, n_layer=2, tied_output=False)]


def _example(spec: TinyModel):
    return example(case=(spec, ("f16", "f16"), [1] + list(range(20, 38)), 5, 7))


def _with_examples(test):
    for spec in EXTRA_EXAMPLES:
        test = _example(spec)(test)
    return test


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@_with_examples
@given(cases())
def test_logits_are_the_same_floats_at_every_thread_count(case):
    spec, (type_k, type_v), tokens, odd, seed = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{spec.arch}.gguf"
        write_tiny_model(spec, path, np.random.default_rng(seed))
        with Model.load(path) as model:
            by_ubatch = {}
            for n_ubatch in (1, odd, len(tokens)):
                first = prompt_logits(model, tokens, 1, n_ubatch, type_k, type_v)
                assert np.isfinite(first).all(), f"non-finite logits at ubatch {n_ubatch}"
                for n_threads in THREADS[1:]:
                    other = prompt_logits(model, tokens, n_threads, n_ubatch, type_k, type_v)
                    same = (other.view(np.uint32) == first.view(np.uint32)).all(axis=1)
                    assert same.all(), (f"{n_threads} threads, ubatch {n_ubatch}: positions "
                                        f"{np.flatnonzero(~same).tolist()} differ from 1 thread")
                by_ubatch[n_ubatch] = first
        # llama.cpp allows a quantized V cache only with flash attention, another algorithm
        # (the invariance itself holds without the peer)
        if type_v == "q8_0" or (peer_problem() is not None and not PEER_REQUIRED):
            return
        require_peer()
        for n_ubatch, ours in by_ubatch.items():
            theirs = llama_cpp_logits(path, tokens, n_ubatch, type_k, type_v)
            assert rel_err(ours, theirs) < 0.02, f"ubatch {n_ubatch}"
            assert (ours.argmax(1) == theirs.argmax(1)).mean() >= 0.9, f"ubatch {n_ubatch}"


def test_real_models_give_the_same_floats_at_every_thread_count(real_model_path):
    with Model.load(real_model_path) as model:
        tokens = model.vocab.tokenize("The quick brown fox jumps over the lazy dog, then it sleeps.", add_special=True)
        for n_ubatch in (1, 7, len(tokens)):
            first = prompt_logits(model, tokens, 1, n_ubatch, "f16", "f16")
            assert np.isfinite(first).all()
            for n_threads in THREADS[1:]:
                other = prompt_logits(model, tokens, n_threads, n_ubatch, "f16", "f16")
                assert (other.view(np.uint32) == first.view(np.uint32)).all(), (n_threads, n_ubatch)


def test_head_sizes_that_are_no_multiple_of_8_give_llama_cpps_logits(tmp_path):
    """Value heads of 36 and 44 values with an f16 cache: P·V converts each V row in 8-value
    vectors, and a row's last partial vector once spilled into the accumulators after it."""
    require_peer()
    tokens = [1, 196, 3, 3, 3, 194, 7, 9, 11]
    types = {k: GGMLType.F16 for k in ("token_embd", "output", "attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up",
                                       "attn_output", "ffn_down")}
    for head_dim in (36, 44):
        spec = TinyModel("llama", n_embd=4 * head_dim, head_dim=head_dim, n_head=4, n_head_kv=2, n_ff=128,
                         n_layer=1, tied_output=False, types=types)
        path = tmp_path / f"h{head_dim}.gguf"
        write_tiny_model(spec, path, np.random.default_rng(0))
        with Model.load(path) as model:
            for n_ubatch in (1, len(tokens)):
                ours = prompt_logits(model, tokens, 2, n_ubatch, "f16", "f16")
                np.testing.assert_array_equal(ours, llama_cpp_logits(path, tokens, n_ubatch, "f16", "f16"))
