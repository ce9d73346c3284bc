"""SmolLM2 quantized by llama.cpp itself to IQ4_XS, IQ4_NL and TQ2_0 (issue 15): gguflm's logits
against llama.cpp's at every position of the reference prompts.

The files are made here: the F16 GGUF of SmolLM2 (conftest's ``smollm_f16``), quantized with
``llama_model_quantize`` through llama-cpp-python. They go to a folder beside pytest's temporary
directories that outlives one run (pytest-of-<user>/gguflm-derived), and are made again only
when missing. llama.cpp falls back to other types where
a row does not fit a 256-block (SmolLM2's n_embd is 576): IQ4_NL for IQ4_XS, Q4_0 for TQ2_0.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

import _ggml
import gguflm
from _llama import require_peer
from conftest import SMOLLM_FILE, load_reference
from gguflm.ggml_types import GGMLType

PRINTED = 6e-5   # the reference's 4 decimals, plus float32 rounding of the comparison
MAX_KL = 0.005
# llama.cpp file types (enum llama_ftype)
FTYPES = {"IQ4_XS": 30, "IQ4_NL": 25, "TQ2_0": 37}


def _quantized(f16: Path, name: str) -> Path:
    require_peer()
    import llama_cpp

    dst = f16.with_name(f"SmolLM2-135M-Instruct.{name}.gguf")
    if not dst.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = FTYPES[name]
        params.nthread = 2
        tmp = dst.with_suffix(".part")
        assert llama_cpp.llama_model_quantize(str(f16).encode(), str(tmp).encode(), ctypes.byref(params)) == 0
        tmp.rename(dst)
    return dst


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("name", list(FTYPES))
def test_llama_cpp_quantized_smollm_matches_llama_cpp(smollm_f16, name):
    """Every prompt position: the same top token, and logits equal to the printed digit or a
    KL divergence (llama.cpp || gguflm) within 0.005."""
    _ggml.require_ggml()
    import llama_cpp

    path = _quantized(smollm_f16, name)
    from quants_oracles import gguf_tensors
    types = {t for t, _, _ in gguf_tensors(path).values()}
    assert GGMLType[name] in types, types
    cases = load_reference(SMOLLM_FILE)["cases"]
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=512, n_threads=2, n_threads_batch=2, verbose=False)
    exact = total = 0
    worst_kl = worst_diff = 0.0
    with gguflm.Model.load(path) as model, _ggml.same_arithmetic(), \
            gguflm.Context(model, n_ctx=512, n_threads=2, n_threads_batch=2) as ctx:
        for case in cases:
            tokens = case["tokens"]
            llm.reset()
            llm.eval(tokens)
            theirs = np.asarray(llm.scores[:len(tokens)], dtype=np.float32)
            ctx.memory.clear()
            batch = gguflm.Batch(len(tokens))
            for pos, tok in enumerate(tokens):
                batch.add(tok, pos, [0], True)
            assert ctx.decode(batch) == 0
            ours = ctx.get_logits()[:len(tokens)].copy()
            assert np.array_equal(ours.argmax(-1), theirs.argmax(-1)), case["prompt"]
            diff = np.abs(ours - theirs).max(axis=-1)
            lt = _log_softmax(theirs)
            kl = (np.exp(lt) * (lt - _log_softmax(ours))).sum(-1)
            assert np.all((diff <= PRINTED) | (kl <= MAX_KL)), (case["prompt"], diff.max(), kl.max())
            exact += int(np.sum(np.all(ours.view(np.uint32) == theirs.view(np.uint32), axis=-1)))
            total += len(tokens)
            worst_kl, worst_diff = max(worst_kl, float(kl.max())), max(worst_diff, float(diff.max()))
    print(f"\n{name}: bit-identical at {exact}/{total} positions, max |diff| {worst_diff:.3g}, max KL {worst_kl:.3g}")
