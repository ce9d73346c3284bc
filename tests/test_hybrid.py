"""The hybrid Mamba + attention architectures (granitehybrid, falcon-h1, nemotron_h, jamba) and the
hybrid memory against llama.cpp (through llama-cpp-python) on tiny random models.

Every comparison is bit for bit, as the other architectures' (tests/test_invariance.py,
tests/test_recurrent.py): the logits of every position, the prompt in ubatches and one token at a
time, at 1 and 2 threads; several sequences of unequal lengths in one batch (llama.cpp's
split_equal by sequence sets for a unified KV cache, by consecutive ids for one in regions);
the memory's answers (seq_rm refused where the recurrent part cannot drop a tail, positions) and
the logits after seq_rm / seq_cp / seq_keep / seq_add; a state saved in the middle and restored;
greedy text of the high-level API. Bad files get named errors.
"""

from __future__ import annotations

import numpy as np
import pytest

from _llama import LlamaDecoder, import_peer
from _memory_pair import (MemoryPair, check_session_file_continues, check_state_saved_in_the_middle, decode_entries,
                          interleaved, random_tokens)
from gguflm import Batch, Context, Model
from gguflm.errors import ModelLoadError
from gguflm.ggml_types import GGMLType
from gguflm.hparams import HParamError
from gguflm.loader import MissingTensorError
from tiny_models import N_VOCAB, TinyHybrid, write_tiny_hybrid

L = import_peer("llama_cpp")

MIXED = {"token_embd": GGMLType.Q8_0, "ssm_in": GGMLType.Q4_0, "ssm_out": GGMLType.Q5_1, "attn_q": GGMLType.Q4_1,
         "attn_v": GGMLType.Q8_0, "ffn_up": GGMLType.Q5_0, "ffn_down": GGMLType.Q4_0, "output": GGMLType.Q8_0,
         "ssm_x": GGMLType.Q8_0, "ffn_up_exps": GGMLType.Q4_0, "ffn_down_exps": GGMLType.Q8_0}
SPECS = {
    # Granite 4: Mamba-2 and attention layers, experts after each, the optional biases
    "granitehybrid": TinyHybrid("granitehybrid", layout="MAMA", n_expert=4, n_expert_used=2, biases=True,
                                tied_output=False, types=MIXED),
    "granitehybrid_dense": TinyHybrid("granitehybrid", layout="AMM", d_state=8, d_conv=3, types=MIXED),
    # attention and Mamba-2 in every layer
    "falcon-h1": TinyHybrid("falcon-h1", layout="AA", biases=True, tied_output=False, types=MIXED),
    # Mamba-2, attention and relu² feed-forward layers
    "nemotron_h": TinyHybrid("nemotron_h", layout="MAFMF", n_group=1, biases=True, types=MIXED),
    # Mamba-1 and attention, experts in layers 1 and 3
    "jamba": TinyHybrid("jamba", layout="MAMA", n_head=4, head_dim=16, n_expert=4, n_expert_used=2,
                        moe_layers=(1, 3), dt_rank=8, types=MIXED),
}


def _write(tmp_path_factory, name: str):
    path = tmp_path_factory.mktemp("hybrid") / f"{name}.gguf"
    write_tiny_hybrid(SPECS[name], path, np.random.default_rng(len(name)))
    return path


@pytest.fixture(scope="module", params=list(SPECS))
def hybrid(request, tmp_path_factory):
    return _write(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def granite(tmp_path_factory):
    return _write(tmp_path_factory, "granitehybrid_dense")


@pytest.mark.parametrize(("n_threads", "n_ubatch"), [(1, 5), (2, 5), (2, 64)])
def test_prompt_and_steps_equal_llama(hybrid, n_threads: int, n_ubatch: int) -> None:
    """Every position's logits: a prompt in ubatches of 5 or at once, then one token at a time."""
    tokens = random_tokens(15, 1)
    ref = LlamaDecoder(hybrid, n_ctx=256, n_threads=n_threads, n_batch=64, n_ubatch=n_ubatch)
    try:
        want = np.concatenate([ref.decode(tokens[:11], 0)] + [ref.decode([t], 11 + k) for k, t in enumerate(tokens[11:])])
    finally:
        ref.close()
    with Model.load(hybrid) as model, Context(model, n_ctx=256, n_batch=64, n_ubatch=n_ubatch, n_threads=n_threads,
                                              n_threads_batch=n_threads) as ctx:
        assert model.architecture.memory == "hybrid"
        got = [decode_entries(ctx, [(t, k, 0, True) for k, t in enumerate(tokens[:11])])]
        got += [decode_entries(ctx, [(t, 11 + k, 0, True)]) for k, t in enumerate(tokens[11:])]
        assert ctx.memory.seq_pos_max(0) == len(tokens) - 1
    np.testing.assert_array_equal(np.concatenate(got), want)


@pytest.mark.parametrize("kv_unified", [True, False])
def test_several_sequences_equal_llama(hybrid, kv_unified: bool) -> None:
    """Three sequences of unequal lengths, interleaved, in one batch (ubatches of equal-length
    sequence sets, then of the longer ones alone), then one step of each in one batch."""
    first = interleaved([6, 1, 4], 2)
    step = [(11, 6, 0, True), (12, 1, 1, True), (13, 4, 2, True)]
    ref = LlamaDecoder(hybrid, n_ctx=256, n_seq_max=3, kv_unified=kv_unified, n_batch=64, n_ubatch=8)
    try:
        want = [ref.decode_batch(first), ref.decode_batch(step)]
    finally:
        ref.close()
    with Model.load(hybrid) as model, Context(model, n_ctx=256, n_batch=64, n_ubatch=8, n_seq_max=3,
                                              kv_unified=kv_unified, n_threads=2) as ctx:
        got = [decode_entries(ctx, first), decode_entries(ctx, step)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(("lengths", "n_ubatch", "kv_unified"), [
    ([3, 3, 3, 2], 5, True), ([1, 1, 7], 64, True), ([2, 5, 1, 4], 3, False), ([4, 4], 1, True)])
def test_split_patterns_equal_llama(granite, lengths: list[int], n_ubatch: int, kv_unified: bool) -> None:
    """More interleavings and ubatch sizes (down to one token per ubatch): llama.cpp's splits."""
    entries = interleaved(lengths, sum(lengths))
    ref = LlamaDecoder(granite, n_ctx=256, n_seq_max=len(lengths), kv_unified=kv_unified, n_batch=64, n_ubatch=n_ubatch)
    try:
        want = ref.decode_batch(entries)
    finally:
        ref.close()
    with Model.load(granite) as model, Context(model, n_ctx=256, n_batch=64, n_ubatch=n_ubatch,
                                               n_seq_max=len(lengths), kv_unified=kv_unified, n_threads=2) as ctx:
        np.testing.assert_array_equal(decode_entries(ctx, entries), want)


def _llama_decode_sets(ref: LlamaDecoder, entries: list[tuple[int, int, tuple[int, ...], bool]]) -> np.ndarray:
    """llama.cpp's decode of (token, pos, sequences, output) entries: the outputs' logits."""
    batch = L.llama_batch_init(len(entries), 0, 4)
    try:
        for k, (tok, pos, seqs, out) in enumerate(entries):
            batch.token[k], batch.pos[k], batch.n_seq_id[k], batch.logits[k] = tok, pos, len(seqs), out
            for j, s in enumerate(seqs):
                batch.seq_id[k][j] = s
        batch.n_tokens = len(entries)
        assert L.llama_decode(ref._ctx, batch) == 0
        return np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(ref._ctx, k), shape=(ref.n_vocab,)).copy()
                         for k, e in enumerate(entries) if e[3]])
    finally:
        L.llama_batch_free(batch)


def test_shared_prompt_equal_llama(granite) -> None:
    """A prompt shared by sequences 0 and 1 (tokens of both) beside sequence 2's in one batch: a
    unified KV cache takes it (ubatches of the sequence sets {0, 1} and {2}, as llama.cpp's
    split_equal), both sequences then go on from the shared state; the logits are llama.cpp's."""
    rng = np.random.default_rng(4)
    first = [(int(rng.integers(3, N_VOCAB)), p, (0, 1), p == 4) for p in range(5)]
    first[2:2] = [(int(rng.integers(3, N_VOCAB)), p, (2,), True) for p in range(3)]
    steps = [[(21, 5, (0,), True), (22, 5, (1,), True), (23, 3, (2,), True)], [(24, 6, (1,), True)]]
    ref = LlamaDecoder(granite, n_ctx=256, n_seq_max=3, n_batch=64, n_ubatch=16)
    try:
        want = [_llama_decode_sets(ref, entries) for entries in [first, *steps]]
    finally:
        ref.close()
    with Model.load(granite) as model, Context(model, n_ctx=256, n_batch=64, n_ubatch=16, n_seq_max=3,
                                               n_threads=2) as ctx:
        for entries, w in zip([first, *steps], want):
            batch = Batch(len(entries), n_seq_max=2)
            for tok, pos, seqs, out in entries:
                batch.add(tok, pos, list(seqs), out)
            assert ctx.decode(batch) == 0
            np.testing.assert_array_equal(np.stack([ctx.get_logits_ith(k) for k, e in enumerate(entries) if e[3]]), w)
        assert [ctx.memory.seq_pos_max(s) for s in range(3)] == [5, 6, 3]


def test_sequence_operations_equal_llama(granite) -> None:
    """seq_rm's answers (the recurrent part refuses a tail: nothing changes in either part), the
    positions, and the logits after seq_rm, seq_cp, seq_keep and seq_add: as llama.cpp's."""
    with MemoryPair(granite, n_seq=4) as both:
        both.decode(interleaved([6, 4, 3], 5))
        both.check_positions()
        for seq, p0, p1 in ((0, 3, -1), (0, 2, 4), (1, 0, 2), (1, 5, 9), (-1, 1, -1), (2, 0, 3), (3, 0, -1)):
            both.seq_rm(seq, p0, p1)
        # the attention part kept sequence 0's rows: the next token still attends over them
        both.decode([(30, 6, 0, True)])
        both.decode([(40, 0, 2, True), (41, 1, 2, True)])         # sequence 2 dropped: starts afresh
        both.seq_cp(0, 3)
        both.decode([(50, 7, 0, True), (51, 7, 3, True), (52, 8, 3, True), (53, 8, 0, True)])
        both.seq_add(1, 0, -1, 5)
        both.decode([(60, 9, 1, True)])
        both.seq_keep(3)
        both.decode([(70, 9, 3, True), (71, 0, 0, True)])
        both.seq_rm(3, 0, -1)


def test_state_saved_in_the_middle_continues(hybrid, tmp_path) -> None:
    """A whole state (KV cache and recurrent states) and one sequence's state put into another
    sequence, saved after a prompt and restored into fresh contexts: the continuation's logits
    are the uninterrupted run's (llama.cpp's)."""
    check_state_saved_in_the_middle(hybrid, random_tokens(12, 7), 8, tmp_path / "state.bin")


def test_control_vector_equal_llama(hybrid) -> None:
    """A control vector on layers 1 .. n_layer - 1 joins each layer where llama.cpp's graph adds
    it (Nemotron-H: its feed-forward layers' branch): the logits are llama.cpp's."""
    import ctypes

    tokens = random_tokens(10, 3)
    with Model.load(hybrid) as model:
        hp = model.hparams
        data = (0.5 * np.random.default_rng(6).standard_normal(hp.n_embd * hp.n_layer)).astype(np.float32)
        ref = LlamaDecoder(hybrid, n_ctx=256, n_threads=2, n_batch=64)
        try:
            assert L.llama_set_adapter_cvec(ref._ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), len(data),
                                            hp.n_embd, 1, hp.n_layer - 1) == 0
            want = np.concatenate([ref.decode(tokens[:8], 0), ref.decode(tokens[8:9], 8), ref.decode(tokens[9:], 9)])
        finally:
            ref.close()
        with Context(model, n_ctx=256, n_batch=64, n_threads=2) as ctx:
            ctx.set_adapter_cvec(data, hp.n_embd, 1, hp.n_layer - 1)
            got = [decode_entries(ctx, [(t, k, 0, True) for k, t in enumerate(tokens[:8])]),
                   decode_entries(ctx, [(tokens[8], 8, 0, True)]), decode_entries(ctx, [(tokens[9], 9, 0, True)])]
    np.testing.assert_array_equal(np.concatenate(got), want)


def test_llm_greedy_text_and_prefix_reuse(granite) -> None:
    """gguflm.llama_cpp.Llama on a hybrid model: _is_hybrid; greedy completions and their
    log-probabilities equal llama-cpp-python's, whether the state is reused or evaluated afresh."""
    from gguflm.llama_cpp import Llama

    theirs = L.Llama(str(granite), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    ours = Llama(str(granite), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    try:
        assert ours._is_hybrid and not ours._is_recurrent
        for prompt in ["p1 p2 p3", "p1 p2 p3 p4 p5", "p1 p9", "p1 p9"]:
            want = theirs.create_completion(prompt, max_tokens=5, temperature=0.0, logprobs=1)["choices"][0]
            got = ours.create_completion(prompt, max_tokens=5, temperature=0.0, logprobs=1)["choices"][0]
            assert got["text"] == want["text"]
            held = L.llama_memory_seq_pos_max(L.llama_get_memory(theirs._ctx.ctx), 0)
            assert ours.n_tokens == theirs.n_tokens and ours.context.memory.seq_pos_max(0) == held
            np.testing.assert_allclose(got["logprobs"]["token_logprobs"], want["logprobs"]["token_logprobs"], atol=1e-4)
    finally:
        theirs.close()
        ours.close()


def test_llm_session_file_holds_both_parts(granite, tmp_path) -> None:
    """gguflm.LLM: a session file (KV cache and states) continues where it was saved, with
    llama-cpp-python's greedy text; the states cannot be cut back to a shorter prefix."""
    check_session_file_continues(granite, tmp_path / "session.bin")


@pytest.mark.parametrize(("spec", "error", "match"), [
    # a layer's recurrent block lacks a tensor
    (TinyHybrid("granitehybrid", layout="MA", drop=("blk.0.ssm_out.weight",)), MissingTensorError,
     "blk.0.ssm_out.weight"),
    # Jamba: a layer with a router but no experts' down matrices
    (TinyHybrid("jamba", layout="MA", n_expert=2, n_expert_used=1, moe_layers=(1,),
                drop=("blk.1.ffn_down_exps.weight",)), MissingTensorError, "blk.1.ffn_down_exps.weight"),
    # 3 SSM heads do not divide the inner size 128
    (TinyHybrid("falcon-h1", layout="AA", dt_rank=3, n_group=1), ModelLoadError, "multiple of time_step_rank"),
    # Jamba's attention layers take n_embd wide Q: 4 heads of 8 do not make 64
    (TinyHybrid("jamba", layout="MA", head_dim=8), HParamError, "do not make embedding_length"),
    # Nemotron-H's mixture-of-experts layers are not implemented
    (TinyHybrid("nemotron_h", layout="MA", metadata={"expert_count": 4}), HParamError, "not supported"),
    # a Falcon-H1 layer without KV heads: every layer attends
    (TinyHybrid("falcon-h1", layout="AM"), HParamError, "does not add up"),
])
def test_bad_files_get_named_errors(tmp_path, spec: TinyHybrid, error: type, match: str) -> None:
    path = tmp_path / "bad.gguf"
    write_tiny_hybrid(spec, path, np.random.default_rng(0))
    with pytest.raises(error, match=match.replace(".", r"\.")):
        Model.load(path)
