"""Perplexity by llama-perplexity's method on both real models, against llama.cpp's own logits."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from _llama import import_peer, peer_missing, peer_problem
from gguflm.model import Model
from gguflm.perplexity import chunk_nll, perplexity

N_CTX = 128
N_CHUNKS = 2


@pytest.fixture(scope="module")
def topics_text() -> str:
    """A fixed text no one here wrote: the start of Python's own pydoc topics."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))[:20000]


def llama_cpp_perplexity(path, text: str, n_ctx: int, n_chunks: int) -> float:
    """The same method on llama.cpp's tokens and logits (llama-cpp-python's low-level API)."""
    llama_cpp = import_peer()
    llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=1,
                          n_threads_batch=1, verbose=False)
    try:
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        add_bos = llama_cpp.llama_vocab_get_add_bos(vocab)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        tokens = llm.tokenize(text.encode(), add_bos=True, special=False)
        first = n_ctx // 2
        batch = llama_cpp.llama_batch_init(n_ctx, 0, 1)
        nll, count = 0.0, 0
        try:
            for i in range(n_chunks):
                chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
                if add_bos:
                    chunk[0] = llm.token_bos()
                llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
                batch.n_tokens = n_ctx
                for k, tok in enumerate(chunk):
                    batch.token[k], batch.pos[k], batch.n_seq_id[k] = tok, k, 1
                    batch.seq_id[k][0] = 0
                    batch.logits[k] = k >= first
                assert llama_cpp.llama_decode(llm.ctx, batch) == 0
                rows = np.stack([_row(llama_cpp.llama_get_logits_ith(llm.ctx, k), n_vocab)
                                 for k in range(first, n_ctx - 1)])
                values = chunk_nll(rows, np.array(chunk[first + 1:]))
                nll += values.sum()
                count += len(values)
        finally:
            llama_cpp.llama_batch_free(batch)
        return math.exp(nll / count)
    finally:
        llm.close()


def _row(pointer, n_vocab: int) -> np.ndarray:
    floats = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(floats, shape=(n_vocab,)).copy()


def test_perplexity_of_both_real_models_equals_llama_cpp(real_model_path, topics_text, capsys):
    with Model.load(real_model_path) as model:
        result = perplexity(model, topics_text, n_ctx=N_CTX, n_chunks=N_CHUNKS, n_threads=1)
    assert result.n_chunks == N_CHUNKS and result.n_scored == N_CHUNKS * (N_CTX // 2 - 1)
    assert len(result.running) == N_CHUNKS and result.running[-1] == result.ppl
    assert math.isfinite(result.ppl) and 1 < result.ppl < 1000
    assert 0 < result.ppl_error < result.ppl
    line = (f"{real_model_path.name}: PPL = {result.ppl:.4f} +/- {result.ppl_error:.4f} "
            f"({N_CHUNKS} chunks of {N_CTX}, pydoc topics)")
    if peer_problem() is not None:   # the comparison needs the reference peer
        with capsys.disabled():
            print(f"\n{line}; no comparison: {peer_problem()}")
        peer_missing(peer_problem())
    reference = llama_cpp_perplexity(real_model_path, topics_text, N_CTX, N_CHUNKS)
    with capsys.disabled():
        print(f"\n{line}; llama.cpp {reference:.4f} ({100 * (result.ppl / reference - 1):+.2f}%)")
    assert result.ppl == pytest.approx(reference, rel=0.01)


def test_chunk_nll_is_the_log_softmax_in_float64():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((5, 50)) * 4).astype(np.float32)
    targets = rng.integers(0, 50, 5)
    x = logits.astype(np.float64)
    expected = np.log(np.exp(x).sum(axis=1)) - x[np.arange(5), targets]
    np.testing.assert_allclose(chunk_nll(logits, targets), expected, rtol=1e-6)


def test_perplexity_refuses_short_texts_and_bad_arguments(smollm_path):
    with Model.load(smollm_path) as model:
        with pytest.raises(ValueError, match="at least 256 tokens"):
            perplexity(model, "Too short.", n_ctx=128)
        with pytest.raises(ValueError):
            perplexity(model, "x", n_ctx=7)
        with pytest.raises(ValueError):
            perplexity(model, "x", n_ctx=128, n_chunks=0)
