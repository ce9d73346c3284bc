"""End to end on the real models: logits that llama.cpp computed, to the last digit.

At prompt position 0 nothing is mixed in by attention (the token sees only itself), so the logits
there depend on the matmuls, norms and activations alone; with ggml's rounding in every dot
product they equal llama.cpp's reference logits (tests/data/reference, printed to 4 decimals).
When llama-cpp-python is installed, the full logits of every prompt position are compared with the
llama.cpp on this machine; position 0 must agree bit for bit, and the other positions are counted.
"""

from __future__ import annotations

import numpy as np
import pytest

import gguflm
from _ggml import require_ggml
from conftest import load_reference

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
    model = gguflm.Model.load(real_model_path)
    cases = load_reference(real_model_path.name)["cases"]
    return model, cases, [_prompt_logits(model, case["tokens"]) for case in cases]


def test_position_zero_equals_llama_cpp_reference(model_and_logits):
    _, cases, logits = model_and_logits
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
    model, cases, logits = model_and_logits
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
