"""LFM2 (short convolutions), Qwen3.5 and Qwen3-Next (gated delta-nets) against llama.cpp (through
llama-cpp-python) on tiny random models of mixed weight types.

Every comparison is bit for bit, as the other recurrent and transformer architectures': the logits
of every position, the whole prompt at once and one token at a time, at 1 and 2 threads, several
sequences in one batch (some of one token), and after seq_rm / seq_cp and a state saved in the
middle and restored.
"""

from __future__ import annotations

import numpy as np
import pytest

from _llama import LlamaDecoder, import_peer
from _memory_pair import MemoryPair, check_state_saved_in_the_middle, decode_entries, interleaved, random_tokens
from gguflm import Context, Model
from gguflm.ggml_types import GGMLType
from tiny_models import TinyLinearHybrid, write_tiny_linear_hybrid

L = import_peer("llama_cpp")

SPECS = {
    "lfm2": TinyLinearHybrid(n_embd=256, types={"token_embd": GGMLType.Q8_0, "shortconv_in_proj": GGMLType.Q4_0,
                              "shortconv_out_proj": GGMLType.Q4_K, "attn_q": GGMLType.Q5_0, "attn_v": GGMLType.Q6_K,
                              "ffn_down": GGMLType.Q8_0}),
    "lfm2_untied": TinyLinearHybrid(n_embd=32, n_head=2, n_head_kv=1, recurrent=(False, True, True), l_cache=4,
                              tied_output=False, types={"output": GGMLType.Q5_1, "ffn_up": GGMLType.F32}),
    "lfm2moe": TinyLinearHybrid(arch="lfm2moe", n_expert=4, recurrent=(True, True, False, True),
                          types={"ffn_gate_exps": GGMLType.Q4_0, "ffn_down_exps": GGMLType.Q8_0}),
    # Qwen3.5: 4 value heads over 2 key heads of 16, attention heads of 32 rotated over 16 dims
    "qwen35": TinyLinearHybrid(arch="qwen35", head_dim=32, recurrent=(True, True, False, True),
                         types={"token_embd": GGMLType.Q8_0, "attn_qkv": GGMLType.Q8_0, "attn_gate": GGMLType.Q4_0,
                                "ssm_out": GGMLType.Q5_1, "attn_q": GGMLType.Q4_1, "ffn_down": GGMLType.Q8_0}),
    "qwen35moe": TinyLinearHybrid(arch="qwen35moe", n_embd=32, head_dim=16, n_head=2, n_head_kv=1, recurrent=(True, False),
                            d_state=32, n_k_heads=1, n_v_heads=2, n_expert=4, tied_output=False,
                            types={"ffn_up_exps": GGMLType.Q8_0, "output": GGMLType.Q5_0}),
    # Qwen3-Next: 4 value heads on 2 key heads, repeated interleaved
    "qwen3next": TinyLinearHybrid(arch="qwen3next", n_embd=32, head_dim=16, n_head=2, n_head_kv=1,
                            recurrent=(True, True, False), n_expert=4,
                            types={"attn_qkv": GGMLType.Q8_0, "ssm_ba": GGMLType.Q4_0, "ffn_down_exps": GGMLType.Q4_1}),
}


@pytest.fixture(scope="module", params=list(SPECS))
def model_path(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("hybrid") / f"{request.param}.gguf"
    write_tiny_linear_hybrid(SPECS[request.param], path, np.random.default_rng(len(request.param)))
    return path


@pytest.mark.parametrize("n_threads", [1, 2])
def test_prompt_and_steps_equal_llama(model_path, n_threads: int) -> None:
    """Every position's logits: a prompt in ubatches of 5, then one token at a time."""
    tokens = random_tokens(15, 1)
    ref = LlamaDecoder(model_path, n_ctx=256, n_threads=n_threads, n_batch=64, n_ubatch=5)
    try:
        want = np.concatenate([ref.decode(tokens[:11], 0)] + [ref.decode([t], 11 + k) for k, t in enumerate(tokens[11:])])
    finally:
        ref.close()
    with Model.load(model_path) as model, Context(model, n_ctx=256, n_batch=64, n_ubatch=5, n_threads=n_threads,
                                                  n_threads_batch=n_threads) as ctx:
        got = [decode_entries(ctx, [(t, k, 0, True) for k, t in enumerate(tokens[:11])])]
        got += [decode_entries(ctx, [(t, 11 + k, 0, True)]) for k, t in enumerate(tokens[11:])]
    np.testing.assert_array_equal(np.concatenate(got), want)


@pytest.mark.parametrize("n_ubatch", [3, 64])
def test_several_sequences_equal_llama(model_path, n_ubatch: int) -> None:
    """Three sequences of 6, 1 and 4 tokens interleaved in one batch, then a step of each."""
    first = interleaved([6, 1, 4], 2)
    step = [(t, p, s, True) for t, p, s in ((11, 6, 0), (12, 1, 1), (13, 4, 2))]
    ref = LlamaDecoder(model_path, n_ctx=256, n_seq_max=3, n_batch=64, n_ubatch=n_ubatch)
    try:
        want = [ref.decode_batch(first), ref.decode_batch(step)]
    finally:
        ref.close()
    with Model.load(model_path) as model, Context(model, n_ctx=256, n_batch=64, n_ubatch=n_ubatch, n_seq_max=3,
                                                  n_threads=2) as ctx:
        got = [decode_entries(ctx, first), decode_entries(ctx, step)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_sequence_operations_and_state_equal_llama(model_path, tmp_path) -> None:
    """seq_rm's answers and the positions, the logits after seq_rm and seq_cp, and a state saved
    in the middle and restored into a fresh context: as llama.cpp's."""
    with MemoryPair(model_path, n_seq=3) as both:
        both.decode(interleaved([5, 3, 4], 5))
        both.check_positions()
        for seq, p0, p1 in ((0, 3, -1), (1, 0, 2), (2, 0, -1)):
            both.seq_rm(seq, p0, p1)
        both.seq_cp(0, 2)
        both.decode([(50, 5, 0, True), (51, 5, 2, True), (52, 6, 2, True), (53, 3, 1, True)])
        saved = both.ctx.state_save(tmp_path / "state.bin", tokens=[1, 2, 3])
        cont = [(60, 7, 2, True), (61, 6, 0, True), (62, 4, 1, True)]
        want = both.ref.decode_batch(cont)
        with Context(both.model, n_ctx=256, n_batch=64, n_seq_max=3, n_threads=1) as fresh:
            assert fresh.state_load(saved) == [1, 2, 3]
            np.testing.assert_array_equal(decode_entries(fresh, cont), want)


def test_state_saved_in_the_middle_continues(model_path, tmp_path) -> None:
    """A whole state and one sequence's state saved after a prompt, restored into fresh contexts
    and into another sequence: the continuation is llama.cpp's uninterrupted run."""
    check_state_saved_in_the_middle(model_path, random_tokens(12, 7), 8, tmp_path / "state.bin")


def test_rope_sections_off_the_text_positions_refused(tmp_path) -> None:
    """Qwen3.5 whose interleaved RoPE would rotate pairs by the fourth section (position 0 for
    text): refused at load with a clear error, not run as plain RoPE."""
    from gguflm.errors import ModelLoadError

    path = tmp_path / "sections.gguf"
    write_tiny_linear_hybrid(TinyLinearHybrid(arch="qwen35", head_dim=32, recurrent=(True, False), rope_sections=(1, 3, 3, 0)),
                      path, np.random.default_rng(0))
    with pytest.raises(ModelLoadError, match="dimension_sections"):
        Model.load(path)


def test_high_level_greedy_text_equals_llama(tmp_path) -> None:
    """gguflm.llama_cpp.Llama on a Qwen3.5: a hybrid (not a pure recurrent) model, whose greedy
    completions, with the state reused or evaluated afresh, are llama-cpp-python's."""
    from gguflm.llama_cpp import Llama

    path = tmp_path / "qwen35.gguf"
    write_tiny_linear_hybrid(SPECS["qwen35"], path, np.random.default_rng(6))
    theirs = L.Llama(str(path), n_ctx=256, n_threads=2, verbose=False)
    ours = Llama(str(path), n_ctx=256, n_threads=2, verbose=False)
    try:
        assert ours._is_hybrid and not ours._is_recurrent
        for prompt in ("p1 p2 p3", "p1 p2 p3 p4", "p1 p9"):
            want = theirs.create_completion(prompt, max_tokens=6, temperature=0.0)["choices"][0]["text"]
            assert ours.create_completion(prompt, max_tokens=6, temperature=0.0)["choices"][0]["text"] == want
    finally:
        theirs.close()
        ours.close()
