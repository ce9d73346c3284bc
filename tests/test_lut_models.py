"""Models whose matrices are of the value-table and ternary formats (IQ4_NL, IQ4_XS, MXFP4, TQ1_0,
TQ2_0) load and compute
llama.cpp's logits: tiny random models of each type (alone, and mixed with the legacy and K-quant
types), compared with the llama.cpp of llama-cpp-python at every prompt position, decoded as one
batch (repacked GEMM, tiled GEMM, llamafile's sgemm) and a token at a time (GEMV, vec_dot).
"""

from __future__ import annotations

import numpy as np
import pytest

import _ggml
from _ggml import require_ggml
from gguflm.ggml_types import GGMLType
from tiny_models import MATRIX_KINDS, TinyModel, prompt_logits, write_tiny_model

TYPES = [GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4, GGMLType.TQ1_0, GGMLType.TQ2_0]


def _llama_cpp_logits(path, tokens, n_ubatch: int) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=256, n_batch=256, n_ubatch=n_ubatch, n_threads=2,
                          n_threads_batch=2, verbose=False)
    llm.eval(list(int(t) for t in tokens))
    return np.asarray(llm.scores[:len(tokens)], dtype=np.float32)


def _check_equal(spec: TinyModel, path, seed: int) -> None:
    write_tiny_model(spec, path, np.random.default_rng(seed))
    tokens = np.random.default_rng(seed + 1).integers(3, 300, 20)
    for n_ubatch in (1, 256):
        theirs = _llama_cpp_logits(path, tokens, n_ubatch)
        with _ggml.same_arithmetic():
            ours = prompt_logits(path, tokens, n_ubatch)
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32), err_msg=f"n_ubatch {n_ubatch}")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_models_of_one_type_equal_llama_cpp(tmp_path, arch, t):
    """Every matrix of type t (a tied output included: the embedding as the output matrix is not
    repacked): llama.cpp's logits at every position, bit for bit."""
    require_ggml()
    spec = TinyModel(arch, n_embd=256, head_dim=64, n_head=4, n_head_kv=2, n_ff=512, types=dict.fromkeys(MATRIX_KINDS, t))
    _check_equal(spec, tmp_path / f"{arch}-{t.name}.gguf", int(t))


def test_mixed_model_equals_llama_cpp(tmp_path):
    """The types beside K-quant and float matrices, a separate output matrix, and an FFN of 260
    rows: IQ4_NL and MXFP4 there are not repacked (rows % 8 != 0), and IQ4_NL's batches go to
    llamafile's sgemm."""
    require_ggml()
    spec = TinyModel("llama", n_embd=256, head_dim=40, n_head=4, n_head_kv=1, n_ff=260, tied_output=False,
                     types={"token_embd": GGMLType.TQ2_0, "output": GGMLType.IQ4_XS, "attn_q": GGMLType.Q4_K,
                            "attn_k": GGMLType.IQ4_XS, "attn_v": GGMLType.TQ1_0, "attn_output": GGMLType.IQ4_NL,
                            "ffn_gate": GGMLType.MXFP4, "ffn_up": GGMLType.IQ4_NL, "ffn_down": GGMLType.F16})
    _check_equal(spec, tmp_path / "mixed.gguf", 5)


def test_rows16_weights_are_held_interleaved_and_equal_llama_cpp(tmp_path):
    """Q4_0, IQ4_NL and MXFP4 matmul weights with whole groups of 16 rows are held in the rows-16
    layout (private copies; the file's bytes once unpacked); the token embedding, which get_rows
    reads and the tied output shares, and the 264-row FFN matrices keep the file's layout. The
    logits equal llama.cpp's, the same loaded by mmap and read into memory."""
    from gguflm import Model, quants
    from gguflm.gguf import GGUFReader

    require_ggml()
    types = {"token_embd": GGMLType.Q4_0, "attn_q": GGMLType.Q4_0, "attn_k": GGMLType.IQ4_NL,
             "attn_v": GGMLType.MXFP4, "attn_output": GGMLType.Q4_0, "ffn_gate": GGMLType.IQ4_NL,
             "ffn_up": GGMLType.Q4_0, "ffn_down": GGMLType.F16}
    spec = TinyModel("llama", n_embd=256, head_dim=64, n_head=4, n_head_kv=2, n_ff=264, types=types)
    path = tmp_path / "rows16.gguf"
    _check_equal(spec, path, 3)
    with Model.load(path) as model:
        t = model.tensors
        assert t["output.weight"] is t["token_embd.weight"] and not t["token_embd.weight"].rows16
        assert not t["blk.0.ffn_gate.weight"].rows16 and not t["blk.0.ffn_up.weight"].rows16   # 264 rows
        with GGUFReader(path) as reader:
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                w = t[f"blk.0.{name}.weight"]
                assert w.rows16 and w.data.flags.owndata
                assert np.array_equal(quants.from_rows16(w.data, w.type), reader.tensor(w.name).data.reshape(w.data.shape))
    tokens = np.random.default_rng(4).integers(3, 300, 12)
    mapped, read = (prompt_logits(path, tokens, 1, load_mode=mode) for mode in ("mmap", "none"))
    np.testing.assert_array_equal(mapped.view(np.uint32), read.view(np.uint32))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_tq1_weights_are_held_as_tq2_and_equal_llama_cpp(tmp_path, tied):
    """TQ1_0 matrices a matmul reads are held as TQ2_0 blocks (private copies, the file's values):
    a tied token embedding too (its rows read from the held blocks), an untied one, which only
    get_rows reads, not. Sizes stay the file's, the memory estimate counts the larger blocks, and
    the logits equal llama.cpp's, the same loaded by mmap and read into memory."""
    from gguflm import Model, quants
    from gguflm.gguf import GGUFReader
    from gguflm.memory import estimate_memory

    require_ggml()
    spec = TinyModel("llama", n_embd=256, head_dim=64, n_head=4, n_head_kv=2, n_ff=512, tied_output=tied,
                     types={**dict.fromkeys(MATRIX_KINDS, GGMLType.TQ1_0), "ffn_down": GGMLType.Q8_0})
    path = tmp_path / "tq1.gguf"
    _check_equal(spec, path, 6)
    with Model.load(path) as model, GGUFReader(path) as reader:
        t = model.tensors
        assert (t["output.weight"] is t["token_embd.weight"]) == tied
        held = {id(w): w for w in t.values() if w.held_as is not None}.values()
        expected = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "token_embd" if tied else "output"}
        assert {w.name.split(".")[-2] for w in held} == expected
        for w in held:
            assert w.type == GGMLType.TQ1_0 and w.kernel_type == GGMLType.TQ2_0 and w.data.flags.owndata
            assert w.nbytes == reader.tensor(w.name).nbytes
            np.testing.assert_array_equal(quants.get(GGMLType.TQ2_0).dequantize(w.data),
                                          quants.get(GGMLType.TQ1_0).dequantize(reader.tensor(w.name).data.reshape(w.data.shape[0], -1)))
        assert model.size_bytes == sum(info.nbytes for info in reader.tensors)
        grown = sum(w.nbytes // 54 * (66 - 54) for w in held)
    assert estimate_memory(path, n_ctx=256).weights == path.stat().st_size + grown
    tokens = np.random.default_rng(7).integers(3, 300, 12)
    mapped, read = (prompt_logits(path, tokens, 1, load_mode=mode) for mode in ("mmap", "none"))
    np.testing.assert_array_equal(mapped.view(np.uint32), read.view(np.uint32))
