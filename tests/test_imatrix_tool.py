"""``gguflm imatrix``: llama-imatrix's importance matrix of a text.

Its sums are checked three ways on SmolLM2: against a numpy recomputation (float64) from the
activations our own forward pass hands the observer, against the layer-0 attention input
computed with numpy from the weights alone, and against llama.cpp's statistics collected as
llama-imatrix collects them (the scheduler's eval callback on every MUL_MAT of a block weight)
from llama.cpp's own forward pass over the same chunk. The file it writes quantizes to the
bytes llama.cpp's quantizer writes given the values llama-quantize's loader makes of it.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
import pytest

import _ggml
import gguflm
import gguflm.quants as q
from _llama import require_peer
from gguflm import cli
from gguflm.imatrix import ImatrixCollector, compute_imatrix, read_imatrix, write_imatrix

N_CTX = 128
N_CHUNKS = 2
THREADS = 1   # the machine is shared: one thread per kernel runs steadiest


def _text() -> str:
    root = Path(gguflm.__file__).parent
    return (root / "quantize.py").read_text() + (root / "imatrix.py").read_text()


@pytest.fixture(scope="module")
def smollm(smollm_path):
    with gguflm.Model.load(smollm_path) as model:
        yield model


@pytest.fixture(scope="module")
def collected(smollm):
    """Our imatrix, and every matmul input our forward pass observed (copies), per chunk."""
    seen: list[tuple[str, np.ndarray]] = []
    original = ImatrixCollector.__call__

    def spy(self, ob):
        for name in ob.names:
            seen.append((name, ob.x.copy()))
        original(self, ob)

    ImatrixCollector.__call__ = spy
    try:
        with _ggml.same_arithmetic():   # round as the local ggml-cpu (for the llama.cpp comparison)
            result = compute_imatrix(smollm, _text(), n_ctx=N_CTX, n_chunks=N_CHUNKS, dataset="text.txt",
                                     n_threads=THREADS)
    finally:
        ImatrixCollector.__call__ = original
    return result, seen


def _chunks(model, n_ctx: int = N_CTX) -> list[np.ndarray]:
    vocab = model.vocab
    tokens = np.asarray(vocab.tokenize(_text(), add_special=True, parse_special=False), np.int32)
    chunks = [tokens[i * n_ctx:(i + 1) * n_ctx].copy() for i in range(N_CHUNKS)]
    if vocab.add_bos and vocab.bos is not None:
        for c in chunks:
            c[0] = vocab.bos
    return chunks


def test_sums_are_the_squares_of_our_activations(collected, smollm):
    result, seen = collected
    im = result.imatrix
    expected: dict[str, np.ndarray] = {}
    rows: dict[str, int] = {}
    for name, x in seen:
        if name.startswith("blk."):
            expected[name] = expected.get(name, 0) + (x.astype(np.float64) ** 2).sum(axis=0)
            rows[name] = rows.get(name, 0) + x.shape[0]
    assert sorted(im.sums) == sorted(expected)
    assert len(im.sums) == 7 * smollm.hparams.n_layer
    for name in expected:
        np.testing.assert_allclose(im.sums[name], expected[name], rtol=2e-6, err_msg=name)
        assert im.counts[name].tolist() == [rows[name]] == [N_CHUNKS * N_CTX]
    assert (im.chunk_count, im.chunk_size, im.datasets) == (N_CHUNKS, N_CTX, ["text.txt"])


def test_layer_0_attention_input_is_the_normed_embedding(collected, smollm):
    """blk.0.attn_q's input recomputed with numpy from the file's weights: RMS norm of the token
    embeddings times attn_norm."""
    _, seen = collected
    emb = smollm.tensors["token_embd.weight"]
    norm = np.asarray(smollm.tensors["blk.0.attn_norm.weight"].data, np.float64)
    eps = smollm.hparams.f_norm_rms_eps
    inputs = [x for name, x in seen if name == "blk.0.attn_q.weight"]
    assert len(inputs) == N_CHUNKS
    for x, chunk in zip(inputs, _chunks(smollm)):
        e = q.get(emb.type).dequantize(np.ascontiguousarray(emb.data[chunk])).astype(np.float64)
        want = e / np.sqrt((e * e).mean(axis=1, keepdims=True) + eps) * norm
        np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-6)


def _llama_imatrix(path: Path, chunks: list[np.ndarray]) -> tuple[dict, dict]:
    """llama-imatrix's collect_imatrix over llama.cpp's own forward pass: for every MUL_MAT whose
    weight is a block's and whose input has at least 16 rows, the column sums of squares; for
    every MUL_MAT_ID, per expert, the squares of the rows routed to it and their number."""
    llama_cpp = require_peer()
    L = llama_cpp
    base = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    base.ggml_op_name.restype, base.ggml_op_name.argtypes = ctypes.c_char_p, [ctypes.c_int]

    class Tensor(ctypes.Structure):   # struct ggml_tensor (ggml.h)
        pass

    Tensor._fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                       ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                       ("flags", ctypes.c_int32), ("src", ctypes.POINTER(Tensor) * 10),
                       ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                       ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}

    def rows(src1, i2: int = 0) -> np.ndarray:
        """src1's rows [ne1, ne0] at index i2 of its third dimension, as float64."""
        n0 = src1.ne[0]
        buf = (ctypes.c_char * (src1.nb[2] * i2 + src1.nb[1] * (src1.ne[1] - 1) + n0 * 4)).from_address(src1.data)
        return np.lib.stride_tricks.as_strided(np.frombuffer(buf, np.float32)[src1.nb[2] * i2 // 4:],
                                               (src1.ne[1], n0), (src1.nb[1], 4)).astype(np.float64)

    def callback(t, ask, user):
        node = ctypes.cast(t, ctypes.POINTER(Tensor)).contents
        op = base.ggml_op_name(node.op)
        if op == b"MUL_MAT_ID":
            if ask:
                return True
            src0, src1, ids = node.src[0].contents, node.src[1].contents, node.src[2].contents
            name, n_as = src0.name.decode(), src0.ne[2]
            raw = (ctypes.c_char * (ids.nb[1] * ids.ne[1])).from_address(ids.data)
            chosen = np.lib.stride_tricks.as_strided(np.frombuffer(raw, np.int32), (ids.ne[1], ids.ne[0]),
                                                     (ids.nb[1], ids.nb[0]))
            acc = sums.setdefault(name, np.zeros((n_as, src1.ne[0])))
            cnt = counts.setdefault(name, np.zeros(n_as, np.int64))
            for row in range(src1.ne[2]):
                x = rows(src1, row)
                for idx in range(ids.ne[0]):
                    ex = chosen[row, idx]
                    acc[ex] += x[idx % src1.ne[1]] ** 2
                    cnt[ex] += 1
            return True
        if op != b"MUL_MAT":
            return not ask
        src0, src1 = node.src[0].contents, node.src[1].contents
        name = src0.name.decode().split("#")[-1] if b"#" in src0.name else src0.name.decode()
        if src1.ne[1] < 16 or src1.type != 0 or not name.startswith("blk."):
            return not ask
        if ask:
            return True
        assert src1.ne[2] == src1.ne[3] == 1
        x = rows(src1)
        sums[name] = sums.get(name, 0) + (x * x).sum(axis=0)
        counts[name] = counts.get(name, 0) + x.shape[0]
        return True

    cb = L.ggml_backend_sched_eval_callback(callback)
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    params = L.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = len(chunks[0])
    params.n_threads = params.n_threads_batch = THREADS
    params.flash_attn_type, params.cb_eval = L.LLAMA_FLASH_ATTN_TYPE_DISABLED, cb
    ctx = L.llama_init_from_model(model, params)
    batch = L.llama_batch_init(len(chunks[0]), 0, 1)
    try:
        for chunk in chunks:
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            for k, tok in enumerate(chunk):
                batch.token[k], batch.pos[k], batch.n_seq_id[k], batch.logits[k] = int(tok), k, 1, True
                batch.seq_id[k][0] = 0
            batch.n_tokens = len(chunk)
            assert L.llama_decode(ctx, batch) == 0
        return sums, counts
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)


def test_sums_match_llama_cpp_collecting_its_own_activations(collected, smollm, smollm_path):
    _ggml.require_ggml()
    result, _ = collected
    theirs, counts = _llama_imatrix(smollm_path, _chunks(smollm))
    im = result.imatrix
    assert sorted(theirs) == sorted(im.sums)
    for name, want in theirs.items():
        assert im.counts[name].tolist() == [counts[name]]
        np.testing.assert_allclose(im.sums[name], want, rtol=1e-4, err_msg=name)


def test_moe_experts_are_counted_per_expert_as_llama_cpp_counts_them(tmp_path):
    """A tiny 8-expert model: per-expert sums and counts of the rows routed to each expert
    (gate/up: the token's row once per slot; down: each slot's own row) against llama.cpp's."""
    _ggml.require_ggml()
    from tiny_models import TinyModel, write_tiny_model
    from gguflm.ggml_types import GGMLType

    path = tmp_path / "moe.gguf"
    spec = TinyModel("llama", n_embd=256, head_dim=64, n_head=4, n_head_kv=2, n_ff=256, n_layer=2,
                     n_expert=8, n_expert_used=2, types={"ffn_gate_inp": GGMLType.F32})
    write_tiny_model(spec, path, np.random.default_rng(7))
    n_ctx = 64
    with gguflm.Model.load(path) as model, _ggml.same_arithmetic():
        result = compute_imatrix(model, _text(), n_ctx=n_ctx, n_chunks=N_CHUNKS, n_threads=THREADS)
        chunks = _chunks(model, n_ctx)
    theirs, counts = _llama_imatrix(path, chunks)
    im = result.imatrix
    assert sorted(theirs) == sorted(im.sums)
    for name, want in theirs.items():
        assert im.counts[name].tolist() == np.atleast_1d(counts[name]).tolist(), name
        np.testing.assert_allclose(im.sums[name], np.asarray(want).reshape(-1), rtol=1e-4, err_msg=name)
    experts = [n for n in im.sums if "_exps" in n]
    assert experts and all(im.counts[n].size == 8 and im.counts[n].sum() == N_CHUNKS * n_ctx * 2
                           for n in experts)


def test_quantizing_with_our_imatrix_file_is_llama_cpp_byte_for_byte(collected, small_f16, tmp_path):
    """The file read as llama-quantize's loader reads it (sums / counts, computed here from the
    gguf package's reading of the file) given to llama.cpp's quantizer; gguflm quantize given the
    file itself."""
    import gguf
    from test_quantize_tool import _llama_quantize, _sha

    path = write_imatrix(tmp_path / "imatrix.gguf", collected[0].imatrix)
    tensors = {t.name: np.array(t.data, np.float32).reshape(-1) for t in gguf.GGUFReader(path).tensors}
    weights = {name[:-len(".in_sum2")]: values / tensors[name[:-len(".in_sum2")] + ".counts"][0]
               for name, values in tensors.items() if name.endswith(".in_sum2")}
    theirs = _llama_quantize(small_f16, tmp_path / "theirs.gguf", "Q4_K_M", imatrix=weights)
    ours = gguflm.quantize(small_f16, tmp_path / "ours.gguf", "Q4_K_M", imatrix=path, nthread=2)
    assert _sha(ours.paths[0]) == _sha(theirs)


def test_cli_writes_an_imatrix_file(smollm_path, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(_text())
    out = tmp_path / "out.gguf"
    assert cli.main(["imatrix", "-m", str(smollm_path), "-f", str(text), "-o", str(out), "--chunks", "2",
                     "-c", str(N_CTX), "-t", "1"]) == 0
    im = read_imatrix(out)
    assert im.chunk_count == 2 and im.chunk_size == N_CTX and im.datasets == [str(text)]
    assert "Final estimate: PPL" in capsys.readouterr().out
    dat = tmp_path / "out.dat"
    assert cli.main(["imatrix", "-m", str(smollm_path), "-f", str(text), "-o", str(dat), "--chunks", "2",
                     "-c", str(N_CTX), "-t", "1"]) == 0
    legacy = read_imatrix(dat)
    assert legacy.is_legacy and sorted(legacy.sums) == sorted(im.sums)
    for name, w in im.importance().items():
        np.testing.assert_allclose(legacy.importance()[name], w, rtol=1e-6)


def test_too_short_a_text_is_a_clear_error(smollm):
    with pytest.raises(ValueError, match="at least"):
        compute_imatrix(smollm, "far too short", n_ctx=N_CTX)
