"""SmolLM2 quantized by llama.cpp itself to IQ4_XS, IQ4_NL, IQ3_S, IQ3_XXS, IQ2_S, Q2_K and TQ2_0
(the value-table, grid and ternary formats): gguflm's logits against llama.cpp's at every position of the reference prompts.

The files are made here: the F16 GGUF of SmolLM2 (conftest's ``smollm_f16``), quantized with
``llama_model_quantize`` through llama-cpp-python. They go to a folder beside pytest's temporary
directories that outlives one run (pytest-of-<user>/gguflm-derived), and are made again only
when missing. llama.cpp falls back to other types where
a row does not fit a 256-block (SmolLM2's n_embd is 576): IQ4_NL for IQ4_XS, Q4_0 for TQ2_0.

So the type named is that of the 1536-column ffn_down matrices (the other i-quants fall back to
IQ4_NL, Q2_K to Q4_0), reached as llama-quant.cpp (0.3.36) allows: the file type IQ2_S makes
IQ2_XS tensors and IQ2_M the IQ2_S ones; IQ3_XXS and IQ2_S refuse to quantize without an
importance matrix (``tensor_requires_imatrix``), so those two get a synthetic one (positive
weights seeded by the tensor's name: they take ggml's weighted code paths like a real one); the
Q2_K file type puts Q3_K on ffn_down, so the Q2_K file is "pure" (the type everywhere it fits).
"""

from __future__ import annotations

import ctypes
import zlib
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
# tensor type -> llama.cpp file type (enum llama_ftype), quantized with an importance matrix, pure
RECIPES = {"IQ4_XS": (30, False, False), "IQ4_NL": (25, False, False), "TQ2_0": (37, False, False),
           "IQ3_S": (26, False, False), "IQ3_XXS": (23, True, False), "IQ2_S": (29, True, False),
           "Q2_K": (10, False, True)}


def _quantized(f16: Path, name: str) -> Path:
    require_peer()
    import llama_cpp

    ftype, with_imatrix, pure = RECIPES[name]
    dst = f16.with_name(f"SmolLM2-135M-Instruct.{name}{'.imatrix' * with_imatrix}{'.pure' * pure}.gguf")
    if not dst.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = 2
        params.pure = pure
        if with_imatrix:
            entries, _arrays = _synthetic_imatrix(f16)   # _arrays: alive while llama.cpp reads them
            params.imatrix = entries
        tmp = dst.with_suffix(".part")
        assert llama_cpp.llama_model_quantize(str(f16).encode(), str(tmp).encode(), ctypes.byref(params)) == 0
        tmp.rename(dst)
    return dst


def _synthetic_imatrix(f16: Path) -> tuple[ctypes.Array, list[np.ndarray]]:
    """llama_model_imatrix_data[] for every matrix of f16, ended by a null name, and the arrays
    it points into."""
    import llama_cpp
    from quants_oracles import gguf_tensors

    matrices = [(name, dims[0]) for name, (_, dims, _) in gguf_tensors(f16).items() if len(dims) == 2]
    entries = (llama_cpp.llama_model_imatrix_data * (len(matrices) + 1))()
    arrays = []
    for entry, (name, k) in zip(entries, matrices):
        arrays.append((0.25 + np.random.default_rng(zlib.crc32(name.encode())).exponential(size=k)).astype(np.float32))
        entry.name, entry.size = name.encode(), k
        entry.data = arrays[-1].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    return entries, arrays


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("name", list(RECIPES))
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
