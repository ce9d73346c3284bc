"""Long prompts: attention over thousands of cache cells (the block path keeps one score row per
query of a block, never the whole n_tokens × n_kv matrix) and ubatches above 512 tokens.

The attention stays ggml's non-flash-attention path (llama-cpp-python's ``Llama`` default,
flash_attn=False): each query's softmax over its whole row, then P·V over the whole row, so that
the logits keep llama.cpp's. Tiling is over queries and heads only: an online softmax over KV
blocks would round differently."""

from __future__ import annotations

import numpy as np
import pytest

import _ggml
from _ggml import require_ggml
from _llama import llama_prompt_logits
from gguflm import Batch, Context, Model, system
from gguflm._ext import ops
from gguflm.ggml_types import GGMLType
from test_ops import arithmetic, attention_reference  # noqa: F401  (arithmetic: a fixture)
from tiny_models import MATRIX_KINDS, TinyModel, write_tiny_model

ISAS = system.supported_isas()


def prompt_logits(model: Model, tokens: list[int], n_ubatch: int, rows: list[int] | None = None,
                  n_threads: int = 2) -> np.ndarray:
    """Logits of the given prompt positions (all by default), the prompt decoded in one call in
    ubatches of n_ubatch tokens."""
    rows = list(range(len(tokens))) if rows is None else rows
    with Context(model, n_ctx=len(tokens) + 64, n_batch=len(tokens), n_ubatch=n_ubatch, n_threads=n_threads,
                 n_threads_batch=n_threads) as ctx:
        batch = Batch(len(tokens))
        wanted = set(rows)
        for pos, tok in enumerate(tokens):
            batch.add(int(tok), pos, [0], pos in wanted)
        assert ctx.decode(batch) == 0
        return np.stack([ctx.get_logits_ith(i) for i in rows])


def long_case(rng, n_cells=700, n_tok=40, n_head=6, n_head_kv=2, dk=64, dv=64):
    """A cache of two sequences with holes, and a ubatch of sequence 0's last tokens."""
    k = rng.standard_normal((n_cells, n_head_kv * dk)).astype(np.float16)
    v = rng.standard_normal((n_cells, n_head_kv * dv)).astype(np.float16)
    cell_pos = np.full(n_cells, -1, np.int32)
    cell_seq = np.zeros(n_cells, np.uint64)
    cell_pos[:500], cell_seq[:500] = np.arange(500), 1           # sequence 0: positions 0..499
    cell_pos[500:650], cell_seq[500:650] = np.arange(150), 2     # sequence 1
    cell_pos[100:110] = -1                                        # a hole (removed cells)
    cell_seq[100:110] = 0
    cell_pos[650:690], cell_seq[650:690] = np.arange(500, 540), 1  # the ubatch's own cells
    tok_pos = np.arange(500, 500 + n_tok, dtype=np.int32)
    tok_seq = np.zeros(n_tok, np.int32)
    q = rng.standard_normal((n_tok, n_head * dk)).astype(np.float32)
    return q, k, v, cell_pos, cell_seq, tok_pos, tok_seq


@pytest.mark.parametrize("n_swa", [0, 96])
def test_long_attention_is_the_same_on_every_isa_and_thread_count(arithmetic, n_swa):
    """The block path (F16 cache, a batch): scalar, AVX2 and AVX-512 registers, 1 to 3 threads,
    bit for bit, over 700 cells with holes and another sequence; and close to float64."""
    q, k, v, cell_pos, cell_seq, tok_pos, tok_seq = long_case(np.random.default_rng(5))
    results = []
    for isa in ISAS:
        for n_threads in (1, 3):
            out = np.empty((q.shape[0], 6 * 64), np.float32)
            with system.using(isa=isa):
                ops.attention(q, k, "f16", v, "f16", len(cell_pos), cell_pos, cell_seq, tok_pos, tok_seq, 6, 2, 64,
                              64, 0.125, out, n_swa=n_swa, n_threads=n_threads)
            results.append(out)
    for out in results[1:]:
        np.testing.assert_array_equal(out.view(np.uint32), results[0].view(np.uint32))
    ref = attention_reference(q, k, v, cell_pos, cell_seq, tok_pos, tok_seq, 6, 2, 64, 64, 0.125, n_swa=n_swa)
    np.testing.assert_allclose(results[0], ref, rtol=0, atol=2e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_long_prompt_in_ubatches_of_1024_equals_llama_cpp(tmp_path, arch):
    """A 1500-token prompt in ubatches of 1024 (then 476) on a float-weight model: llama.cpp's
    logits at every position, bit for bit (the attention over up to 1500 cells included)."""
    require_ggml()
    spec = TinyModel(arch, n_embd=84, head_dim=16, n_head=4, n_head_kv=2, n_ff=176,
                     types=dict.fromkeys(MATRIX_KINDS, GGMLType.F32))
    path = tmp_path / f"{arch}.gguf"
    write_tiny_model(spec, path, np.random.default_rng(2))
    tokens = [int(t) for t in np.random.default_rng(3).integers(3, 300, 1500)]
    theirs = llama_prompt_logits(path, tokens, n_ctx=1600, n_batch=1600, n_ubatch=1024, n_threads=2,
                                 n_threads_batch=2)
    with Model.load(path) as model, _ggml.same_arithmetic():
        ours = prompt_logits(model, tokens, 1024)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_ubatch_of_1024_gives_the_floats_of_smaller_ones(smollm_path):
    """SmolLM2, an 1100-token prompt: ubatches of 1024 give the logits of ubatches of 512, bit for bit,
    at positions on both sides of every ubatch boundary."""
    tokens = [int(t) for t in np.random.default_rng(4).integers(100, 40000, 1100)]
    rows = [0, 1, 511, 512, 700, 1023, 1024, 1025, 1099]
    with Model.load(smollm_path) as model:
        big = prompt_logits(model, tokens, 1024, rows)
        small = prompt_logits(model, tokens, 512, rows)
    assert np.isfinite(big).all()
    np.testing.assert_array_equal(big.view(np.uint32), small.view(np.uint32))
