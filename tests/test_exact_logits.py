"""End to end on the real models: logits that llama.cpp computed, to the last digit.

At prompt position 0 nothing is mixed in by attention (the token sees only itself), so the logits
there depend on the matmuls, norms and activations alone; with ggml's rounding in every dot
product they equal llama.cpp's reference logits (tests/data/reference, printed to 4 decimals).
When llama-cpp-python is installed, the full logits of every prompt position are compared with the
llama.cpp on this machine (in its build's arithmetic); position 0 must agree bit for bit, and the
other positions are counted. Tiny models with float weights (F32, F16, BF16) must agree with it at
every position, a token at a time and as one batch.
"""

from __future__ import annotations

import numpy as np
import pytest

import _ggml
import gguflm
from _ggml import require_ggml
from conftest import load_reference
from gguflm import system
from gguflm.ggml_types import GGMLType
from tiny_models import MATRIX_KINDS, TinyModel, prompt_logits, write_tiny_model

PRINTED = 6e-5   # the reference's 4 decimals, plus float32 rounding of the comparison


def _prompt_logits(model: gguflm.Model, tokens: list[int]) -> np.ndarray:
    """Logits [n_tokens, n_vocab] of a prompt decoded as one batch, every position an output."""
    ctx = gguflm.Context(model, n_ctx=512, n_threads=2, n_threads_batch=2)
    batch = gguflm.Batch(len(tokens))
    for pos, tok in enumerate(tokens):
        batch.add(tok, pos, [0], True)
    assert ctx.decode(batch) == 0
    return np.stack([ctx.get_logits_ith(i) for i in range(len(tokens))])


@pytest.fixture(scope="module")
def model_and_logits(real_model_path):
    """The model, the reference cases and gguflm's logits of them in the arithmetic in force."""
    model = gguflm.Model.load(real_model_path)
    cases = load_reference(real_model_path.name)["cases"]
    return model, cases, [_prompt_logits(model, case["tokens"]) for case in cases], system.current_arithmetic()


def test_position_zero_equals_llama_cpp_reference(model_and_logits):
    _, cases, logits, _ = model_and_logits
    later = []
    for case, rows in zip(cases, logits):
        ids, ref = np.array(case["top20_ids"]), np.array(case["top20_logits"])
        diff = np.abs(np.take_along_axis(rows, ids, axis=1) - ref).max(axis=1)
        assert diff[0] <= PRINTED, (case["prompt"], diff[0])
        later.extend(diff[1:])
    later = np.array(later)
    print(f"\npositions 1+: {np.sum(later <= PRINTED)}/{later.size} within {PRINTED}, max |diff| {later.max():.3g}")


def test_logits_equal_local_llama_cpp(model_and_logits, real_model_path):
    require_ggml()
    import llama_cpp
    model, cases, logits, arithmetic = model_and_logits
    with _ggml.same_arithmetic() as theirs:
        if theirs != arithmetic:   # the fixture's logits are in another build's rounding
            logits = [_prompt_logits(model, case["tokens"]) for case in cases]
    llm = llama_cpp.Llama(str(real_model_path), logits_all=True, n_ctx=512, n_threads=2, n_threads_batch=2,
                          verbose=False)
    exact = total = 0
    for case, rows in zip(cases, logits):
        llm.reset()
        llm.eval(case["tokens"])
        theirs = np.asarray(llm.scores[:len(case["tokens"])], dtype=np.float32)
        same = np.all(rows.view(np.uint32) == theirs.view(np.uint32), axis=1)
        assert same[0], (case["prompt"], np.abs(rows[0] - theirs[0]).max())
        exact, total = exact + int(same.sum()), total + len(same)
    print(f"\nfull logits bit-identical with llama.cpp at {exact}/{total} prompt positions")


# n_embd 84: float rows whose last whole 64-element step leaves 20 elements, which the builds'
# vectorized leftover loops fuse differently; n_ff 176 (SwiGLU's vector loop covers it: ggml
# takes the elements after the last 16 (8) through libm's expf, which gguflm does not reproduce)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("t", [GGMLType.F32, GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_float_weight_models_equal_local_llama_cpp(tmp_path, arch, t):
    """Every matrix F32, F16 or BF16: llama.cpp's logits at every position, bit for bit, a token at
    a time (vec_dot) and as one batch (tinyBLAS, vec_dot where it declines the shape); rounding
    as another build does gives other logits."""
    require_ggml()
    import llama_cpp
    spec = TinyModel(arch, n_embd=84, head_dim=16, n_head=4, n_head_kv=2, n_ff=176, types=dict.fromkeys(MATRIX_KINDS, t))
    path = tmp_path / f"{arch}-{t.name}.gguf"
    write_tiny_model(spec, path, np.random.default_rng(int(t)))
    tokens = np.random.default_rng(1).integers(3, 300, 20)
    for n_ubatch in (1, 256):
        llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=256, n_batch=256, n_ubatch=n_ubatch, n_threads=2,
                              n_threads_batch=2, verbose=False)
        llm.eval(list(tokens))
        theirs = np.asarray(llm.scores[:len(tokens)], dtype=np.float32)
        with _ggml.same_arithmetic() as arithmetic:
            ours = prompt_logits(path, tokens, n_ubatch)
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32), err_msg=f"n_ubatch {n_ubatch}")
        other = "avx512" if arithmetic == "avx2" else "avx2"
        with system.using(arithmetic=other):
            assert not np.array_equal(prompt_logits(path, tokens, n_ubatch), ours), other
