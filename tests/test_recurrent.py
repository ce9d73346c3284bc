"""Mamba, Mamba-2 and the recurrent memory against llama.cpp (through llama-cpp-python) on tiny random models.

Every comparison is bit for bit, as the transformer architectures' (tests/test_invariance.py):
the logits of every position, the whole prompt at once and one token at a time, at 1 and 2
threads, several sequences in one batch (llama.cpp's equal split, ubatches of several sequences
and of one), and after the memory's sequence operations, whose results (seq_rm's refusals, the
positions) must be llama.cpp's too; a state saved in the middle and restored continues as the
uninterrupted run; greedy text of the high-level APIs equals llama-cpp-python's.
"""

from __future__ import annotations

import numpy as np
import pytest

from _llama import LlamaDecoder, import_peer, llama_embeddings
from _memory_pair import (MemoryPair, check_session_file_continues, check_state_saved_in_the_middle, decode_entries,
                          interleaved, random_tokens)
from gguflm import Batch, Context, Model
from gguflm.ggml_types import GGMLType
from tiny_models import TinyMamba, write_tiny_mamba

L = import_peer("llama_cpp")

MIXED = {"token_embd": GGMLType.Q8_0, "ssm_in": GGMLType.Q4_0, "ssm_x": GGMLType.Q4_K, "ssm_dt": GGMLType.F32,
         "ssm_out": GGMLType.Q6_K, "output": GGMLType.Q5_1}
SPECS = {"f16": TinyMamba(),
         "mixed": TinyMamba(n_embd=128, n_layer=3, d_state=8, d_conv=3, dt_rank=8, tied_output=False, types=MIXED),
         "dt_b_c_rms": TinyMamba(n_embd=32, d_state=4, dt_b_c_rms=True),
         # Mamba-2: 8 heads of 16 channels in 2 groups, states of 64 (whole vectors in ggml's scan)
         # and of 40 (vectors and a scalar rest)
         "mamba2": TinyMamba(arch="mamba2", n_embd=64, d_state=64, dt_rank=8, n_group=2,
                             types={"ssm_in": GGMLType.Q8_0, "ssm_out": GGMLType.Q4_0}),
         "mamba2_rest": TinyMamba(arch="mamba2", n_embd=32, n_layer=3, d_state=40, d_conv=3, dt_rank=4,
                                  tied_output=False, types={"output": GGMLType.Q5_0})}


@pytest.fixture(scope="module", params=list(SPECS))
def mamba(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("mamba") / f"{request.param}.gguf"
    write_tiny_mamba(SPECS[request.param], path, np.random.default_rng(len(request.param)))
    return path


@pytest.fixture(scope="module")
def mamba_f16(tmp_path_factory):
    path = tmp_path_factory.mktemp("mamba") / "f16.gguf"
    write_tiny_mamba(SPECS["f16"], path, np.random.default_rng(3))
    return path


@pytest.mark.parametrize("n_threads", [1, 2])
def test_prompt_and_steps_equal_llama(mamba, n_threads: int) -> None:
    """Every position's logits: a prompt at once, in ubatches of 5, then one token at a time."""
    tokens = random_tokens(19, 1)
    ref = LlamaDecoder(mamba, n_ctx=256, n_threads=n_threads, n_batch=64, n_ubatch=5)
    try:
        want = np.concatenate([ref.decode(tokens[:12], 0)] + [ref.decode([t], 12 + k) for k, t in enumerate(tokens[12:])])
    finally:
        ref.close()
    with Model.load(mamba) as model, Context(model, n_ctx=256, n_batch=64, n_ubatch=5, n_threads=n_threads,
                                             n_threads_batch=n_threads) as ctx:
        got = [decode_entries(ctx, [(t, k, 0, True) for k, t in enumerate(tokens[:12])])]
        got += [decode_entries(ctx, [(t, 12 + k, 0, True)]) for k, t in enumerate(tokens[12:])]
        assert ctx.memory.seq_pos_max(0) == ctx.memory.seq_pos_min(0) == len(tokens) - 1
    np.testing.assert_array_equal(np.concatenate(got), want)


@pytest.mark.parametrize("n_ubatch", [3, 64])
def test_several_sequences_equal_llama(mamba, n_ubatch: int) -> None:
    """Three sequences of unequal lengths in one batch, interleaved (equal-split ubatches of
    several sequences, then of the longer ones alone), then a step of each in one batch."""
    first = interleaved([7, 2, 5], 2)
    step = [(t, p, s, True) for t, p, s in ((11, 7, 0), (12, 2, 1), (13, 5, 2))]
    ref = LlamaDecoder(mamba, n_ctx=256, n_seq_max=3, n_batch=64, n_ubatch=n_ubatch)
    try:
        want = [ref.decode_batch(first), ref.decode_batch(step)]
    finally:
        ref.close()
    with Model.load(mamba) as model, Context(model, n_ctx=256, n_batch=64, n_ubatch=n_ubatch, n_seq_max=3,
                                             n_threads=2) as ctx:
        got = [decode_entries(ctx, first), decode_entries(ctx, step)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_sequence_operations_equal_llama(mamba_f16) -> None:
    """seq_rm's answers (a partial range refused, a whole sequence dropped), the positions, and
    the logits after seq_rm, seq_cp, seq_keep and seq_add: as llama.cpp's."""
    with MemoryPair(mamba_f16, n_seq=4) as both:
        both.decode(interleaved([6, 4, 3], 5))
        both.check_positions()
        for seq, p0, p1 in ((0, 3, -1), (0, 2, 4), (1, 0, 2), (1, 5, 9), (-1, 1, -1), (-1, 2, 2), (2, 0, 3),
                            (3, 0, -1)):
            both.seq_rm(seq, p0, p1)
        both.decode([(40, 0, 2, True), (41, 1, 2, True)])         # sequence 2 dropped: starts afresh
        both.seq_cp(0, 3)
        both.decode([(50, 6, 0, True), (51, 6, 3, True), (52, 7, 3, True), (53, 7, 0, True)])   # both go on from the copy
        both.seq_add(1, 0, -1, 5)
        both.decode([(60, 9, 1, True)])
        both.seq_keep(3)
        both.decode([(70, 8, 3, True), (71, 0, 0, True)])
        both.seq_rm(3, 0, -1)


def test_state_saved_in_the_middle_continues(mamba_f16, tmp_path) -> None:
    """A whole state, and one sequence's state put into another sequence, saved after a prompt
    and restored into fresh contexts: the continuation's logits are the uninterrupted run's
    (llama.cpp's)."""
    check_state_saved_in_the_middle(mamba_f16, random_tokens(14, 7), 9, tmp_path / "state.bin")


def test_coupled_sequences_refused(mamba_f16) -> None:
    """A token of two sequences cannot be cut into equal ubatches: no memory slot (1), as llama.cpp."""
    with Model.load(mamba_f16) as model, Context(model, n_ctx=256, n_seq_max=2, n_threads=1) as ctx:
        batch = Batch(2, n_seq_max=2)
        batch.add(5, 0, [0, 1], False)
        batch.add(6, 1, [0, 1], True)
        assert ctx.decode(batch) == 1
        assert ctx.memory.seq_pos_max(0) == -1


def test_session_reuses_only_a_held_prefix(mamba_f16) -> None:
    """gguflm.LLM: a prompt extending everything the state holds reuses it; one that diverges
    inside it is evaluated afresh; the logits are those of the prompt evaluated alone either way."""
    from gguflm.generate import Session

    first, longer, other = random_tokens(6, 8), random_tokens(6, 8) + random_tokens(3, 9), random_tokens(4, 8)[:3] + [7, 8]
    with Model.load(mamba_f16) as model, Context(model, n_ctx=256, n_threads=2) as ctx:
        session = Session(ctx)
        assert session.ingest(first) == 0
        assert session.ingest(longer) == len(first)
        after_reuse = ctx.get_logits_ith(-1).copy()
        assert session.ingest(other) == 0
        assert ctx.memory.seq_pos_max(0) == len(other) - 1
        ctx.memory.clear()
        np.testing.assert_array_equal(decode_entries(ctx, [(t, k, 0, k == len(longer) - 1) for k, t in enumerate(longer)])[0],
                                      after_reuse)


def test_llm_greedy_text_and_prefix_reuse(mamba_f16) -> None:
    """gguflm.llama_cpp.Llama's greedy completions equal llama-cpp-python's; a prompt extending
    what the state holds reuses it, any other is evaluated afresh (a state cannot drop a tail)."""
    from gguflm.llama_cpp import Llama

    prompts = ["p1 p2 p3", "p1 p2 p3 p4 p5", "p1 p9", "p1 p9"]
    theirs = L.Llama(str(mamba_f16), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    ours = Llama(str(mamba_f16), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    try:
        assert ours._is_recurrent and not ours._is_hybrid
        for prompt in prompts:
            # the log-probabilities of the generated tokens: a reused state must be
            # the one the tokens give
            want = theirs.create_completion(prompt, max_tokens=6, temperature=0.0, logprobs=1)["choices"][0]
            got = ours.create_completion(prompt, max_tokens=6, temperature=0.0, logprobs=1)["choices"][0]
            assert got["text"] == want["text"]
            # what the state holds: the tokens held (reused or evaluated again, as llama-cpp-python)
            held = L.llama_memory_seq_pos_max(L.llama_get_memory(theirs._ctx.ctx), 0)
            assert ours.n_tokens == theirs.n_tokens and ours.context.memory.seq_pos_max(0) == held
            # (the shim's log-softmax rounds its own way: close, not equal)
            np.testing.assert_allclose(got["logprobs"]["token_logprobs"], want["logprobs"]["token_logprobs"], atol=1e-4)
    finally:
        theirs.close()
        ours.close()


def test_llm_session_file_and_memory_estimate(mamba_f16, tmp_path) -> None:
    """gguflm.LLM on a Mamba: a session file continues where it was saved (llama.cpp's greedy
    text either way); a state cannot be cut back to a shorter prefix; the memory estimate counts
    the states."""
    import gguflm

    check_session_file_continues(mamba_f16, tmp_path / "session.bin")
    hp = Model.load(mamba_f16, vocab_only=False)
    try:
        r, s = hp.architecture.state_sizes(hp.hparams)
        est = gguflm.estimate_memory(mamba_f16, n_ctx=256, n_seq_max=3)
        assert est.kv_cells == (3,) and est.kv_cache >= 3 * hp.hparams.n_layer * 4 * (r + s)
    finally:
        hp.close()


@pytest.mark.parametrize(("pooling", "name"), [(0, "none"), (1, "mean"), (3, "last")])
def test_embeddings_equal_llama(mamba_f16, pooling: int, name: str) -> None:
    """Every token an output: llama.cpp's split_seq (one sequence per ubatch), pooled or not."""
    lists = [random_tokens(4, 10), random_tokens(3, 11), random_tokens(6, 12)]
    want = llama_embeddings(mamba_f16, lists, pooling)
    with Model.load(mamba_f16) as model, Context(model, n_ctx=256, n_seq_max=3, embeddings=True, pooling=name,
                                                 n_threads=2) as ctx:
        batch = Batch(sum(map(len, lists)), n_seq_max=1)
        for s, tokens in enumerate(lists):
            for pos, tok in enumerate(tokens):
                batch.add(tok, pos, [s], True)
        assert ctx.decode(batch) == 0
        rows = np.split(ctx.get_embeddings(), np.cumsum([len(t) for t in lists])[:-1])
        for s in range(len(lists)):
            np.testing.assert_array_equal(rows[s] if pooling == 0 else ctx.get_embeddings_seq(s), want[s])
