"""DeepSeek-V2's multi-head latent attention and DeepSeek's routed experts against llama.cpp, and
MiniCPM3's latent attention with full heads.

Tiny random deepseek2 models (tests/tiny_models.py's :class:`TinyMLA`: Q through its low rank or
the Lite form's one matrix, every weight type mixed per tensor, softmax / sigmoid / softmax-after-
top-k routing with and without the selection bias, normalised and scaled weights, group-limited
selection, YaRN) give llama.cpp's logits at every position, in ubatches of one token and of the
whole prompt, the same floats at 1 and 2 threads; and after llama.cpp's seq_rm and K shift of
the latent cache (RoPE re-applied to the rotated tail of each cached row).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings

from _llama import LlamaDecoder, require_peer
from gguflm import Batch, Context, Model
from gguflm.errors import ModelLoadError
from gguflm.ggml_types import GGMLType
from test_invariance import check_logits_against_llama_cpp
from tiny_models import N_VOCAB, TinyMLA, tiny_mla_models, write_tiny_mla

TOKENS = [1] + list(range(20, 37))
SIGMOID_GROUPS = {"expert_gating_func": 2, "expert_weights_norm": True, "expert_weights_scale": 2.5,
                  "expert_group_count": 4, "expert_group_used_count": 2}
YARN = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 64,
        "rope.scaling.yarn_log_multiplier": 0.0707}
MIXED = {"attn_q_a": GGMLType.Q4_K, "attn_q_b": GGMLType.Q8_0, "attn_kv_a_mqa": GGMLType.Q6_K,
         "attn_k_b": GGMLType.Q8_0, "attn_v_b": GGMLType.BF16, "attn_output": GGMLType.Q4_0,
         "ffn_gate_exps": GGMLType.Q4_K, "ffn_up_exps": GGMLType.Q5_K, "ffn_down_exps": GGMLType.Q8_0,
         "ffn_gate_inp": GGMLType.F32, "ffn_up_shexp": GGMLType.Q2_K, "output": GGMLType.Q6_K}

EXAMPLES = [
    TinyMLA(n_embd=256, metadata=SIGMOID_GROUPS, types=MIXED),                                   # DeepSeek V3's routing
    TinyMLA(q_lora_rank=0, n_layer=3, metadata={"expert_weights_scale": 1.0}),       # V2-Lite: softmax
    TinyMLA(n_head=3, metadata={**YARN, "expert_gating_func": 3}, probs_bias=False,  # YaRN, softmax after top-k
            tensor_types={"blk.0.attn_k_b.weight": GGMLType.F32, "blk.1.attn_v_b.weight": GGMLType.F32}),
    TinyMLA("minicpm3", n_layer=3, types={"attn_kv_b": GGMLType.Q8_0, "attn_q_b": GGMLType.Q4_0}),  # full heads
    TinyMLA(absorbed=False, metadata={**YARN, **SIGMOID_GROUPS}),   # a DeepSeek-V2 file from before attn_k_b
]


def check_against_llama_cpp(spec: TinyMLA, path: Path, seed: int) -> None:
    write_tiny_mla(spec, path, np.random.default_rng(seed))
    with Model.load(path) as model:
        check_logits_against_llama_cpp(model, path, TOKENS)


@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@example(spec=EXAMPLES[0])
@example(spec=EXAMPLES[1])
@example(spec=EXAMPLES[2])
@example(spec=EXAMPLES[3])
@example(spec=EXAMPLES[4])
@given(spec=tiny_mla_models())
def test_latent_attention_gives_llama_cpps_logits(tmp_path, spec):
    require_peer()
    check_against_llama_cpp(spec, tmp_path / f"{spec.arch}.gguf", 7)


def test_more_than_64_query_heads_share_one_latent_row(tmp_path):
    """DeepSeek-V3 attends with 128 query heads over its one latent K row: 96 here."""
    require_peer()
    check_against_llama_cpp(TinyMLA(n_head=96, qk_nope=16, qk_rope=8, v_head=16, n_layer=1, n_dense_lead=0),
                            tmp_path / "deepseek2.gguf", 2)


@pytest.mark.parametrize("spec", EXAMPLES[2:], ids=["yarn", "minicpm3", "full-heads"])
def test_latent_attention_after_seq_rm_and_a_k_shift(tmp_path, spec):
    """Decode a prompt, drop its tail (seq_rm), shift the rest (seq_add: RoPE re-applied to the
    rotated part at the end of each cached latent row), decode on: llama.cpp's logits to the bit."""
    path = tmp_path / f"{spec.arch}.gguf"
    write_tiny_mla(spec, path, np.random.default_rng(3))
    rng = np.random.default_rng(4)
    first, more = [1] + [int(t) for t in rng.integers(3, N_VOCAB - 2, 13)], [int(t) for t in rng.integers(3, N_VOCAB - 2, 5)]
    # (tokens, first position, then seq_rm from, then shift by)
    steps = [(first, 0, 10, 6), (more, 16, None, -3), (more[:2], 18, None, 0)]
    peer = LlamaDecoder(path, type_k=1, type_v=1)
    try:
        theirs = []
        for chunk, start, rm_from, shift in steps:
            theirs.append(peer.decode(chunk, start))
            if rm_from is not None:
                assert peer.seq_rm(0, rm_from, -1)
            if shift:
                peer.seq_add(0, 0, -1, shift)
    finally:
        peer.close()
    with Model.load(path) as model, Context(model, n_ctx=256, n_threads=2, n_threads_batch=2) as ctx:
        for (chunk, start, rm_from, shift), expected in zip(steps, theirs):
            batch = Batch(len(chunk))
            for k, tok in enumerate(chunk):
                batch.add(tok, start + k, [0], True)
            assert ctx.decode(batch) == 0
            np.testing.assert_array_equal(ctx.get_logits(), expected)
            if rm_from is not None:
                assert ctx.memory.seq_rm(0, rm_from, -1)
            if shift:
                ctx.memory.seq_add(0, 0, -1, shift)


def test_the_latent_cache_holds_k_rows_only(tmp_path):
    """The cache keeps one latent row (kv_lora_rank + n_rot values) per token and layer and no V
    rows; a quantized K cache, which ggml cannot read V from, is refused."""
    path = tmp_path / "deepseek2.gguf"
    spec = TinyMLA(kv_lora_rank=48)   # rows of 64 values: whole q8_0 blocks
    write_tiny_mla(spec, path, np.random.default_rng(0))
    with Model.load(path) as model:
        with Context(model, n_ctx=256, type_k="f16") as ctx:
            assert ctx.memory.nbytes == spec.n_layer * 256 * (spec.kv_lora_rank + spec.qk_rope) * 2
        with pytest.raises(ValueError, match="multi-head latent attention"):
            Context(model, n_ctx=256, type_k="q8_0")


def test_expert_groups_must_divide_the_experts(tmp_path):
    """As llama.cpp asserts: equal groups, fewer used than there are."""
    path = tmp_path / "deepseek2.gguf"
    for groups, used in ((3, 1), (4, 4), (4, 0)):
        write_tiny_mla(TinyMLA(metadata={"expert_group_count": groups, "expert_group_used_count": used}),
                             path, np.random.default_rng(0))
        with pytest.raises(ModelLoadError, match="expert_group_count"):
            Model.load(path)


def test_the_latent_cache_survives_a_state_round_trip(tmp_path):
    """A saved state holds the latent rows (and no V rows); loaded into a fresh context, decoding
    on gives the logits the first context gives."""
    path = tmp_path / "deepseek2.gguf"
    write_tiny_mla(TinyMLA(), path, np.random.default_rng(1))
    prompt, more = TOKENS[:10], TOKENS[10:14]

    def decode(ctx: Context, tokens: list[int], start: int) -> np.ndarray:
        batch = Batch(len(tokens))
        for k, tok in enumerate(tokens):
            batch.add(tok, start + k, [0], True)
        assert ctx.decode(batch) == 0
        return ctx.get_logits().copy()

    with Model.load(path) as model:
        with Context(model, n_ctx=256) as ctx:
            decode(ctx, prompt, 0)
            state = ctx.state_save(tokens=prompt)
            expected = decode(ctx, more, len(prompt))
        with Context(model, n_ctx=256) as ctx:
            assert ctx.state_load(state) == prompt
            np.testing.assert_array_equal(decode(ctx, more, len(prompt)), expected)
