"""DeepSeek's routed experts under Llama-like blocks against llama.cpp: glm4moe (GLM-4.5) and
bailingmoe2 (Ling 2),
ernie4_5-moe, hunyuan-moe and hunyuan-dense (whose block the MoE shares), phimoe, smallthinker.

Tiny random models (tests/tiny_models.py's :class:`TinyRouted`: every weight type mixed per
tensor, softmax / sigmoid / softmax-after-top-k routing, the selection bias, normalised and
scaled weights, group-limited selection, dense leading layers, shared experts, NextN blocks the
file carries and inference skips) give llama.cpp's logits at every position, in ubatches of one
token and of the whole prompt, the same floats at 1 and 2 threads.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings

from _llama import require_peer
from gguflm import Model
from gguflm.errors import ModelLoadError
from gguflm.ggml_types import GGMLType
from test_invariance import check_logits_against_llama_cpp
from tiny_models import TinyRouted, tiny_routed_models, write_tiny_routed

TOKENS = [1] + list(range(20, 37))
MIXED = {"attn_q": GGMLType.Q4_K, "attn_k": GGMLType.Q8_0, "attn_v": GGMLType.Q6_K, "attn_output": GGMLType.Q4_0,
         "ffn_gate_exps": GGMLType.Q4_K, "ffn_up_exps": GGMLType.Q5_K, "ffn_down_exps": GGMLType.Q8_0,
         "ffn_gate_inp": GGMLType.F32, "ffn_up_shexp": GGMLType.IQ4_NL, "output": GGMLType.Q6_K}
EXAMPLES = [
    # GLM-4.5-Air's routing (sigmoid, bias, normalised, scaled), a NextN block, Q/K norms
    TinyRouted(n_embd=256, qk_norm=True, nextn=1, types=MIXED,
               metadata={"expert_weights_norm": True, "expert_weights_scale": 2.5}),
    # group-limited, softmax after top-k
    TinyRouted(n_layer=3, metadata={"expert_gating_func": 3, "expert_group_count": 4, "expert_group_used_count": 1}),
    # Ling 2's routing: sigmoid, bias, groups, shared experts of their own width; a NextN block
    TinyRouted("bailingmoe2", n_embd=256, head_dim=64, n_rot=32, nextn=1, n_shared=2, types=MIXED,
               metadata={"expert_gating_func": 2, "expert_weights_norm": True, "expert_weights_scale": 2.5,
                         "expert_group_count": 4, "expert_group_used_count": 2,
                         "expert_shared_feed_forward_length": 48}),
    # ERNIE's softmax routing, always normalised, with a shared expert of its own width
    TinyRouted("ernie4_5-moe", n_embd=256, n_rot=16, types=MIXED, metadata={"expert_shared_feed_forward_length": 64}),
    # Hunyuan: Q/K norms after RoPE, experts feed_forward_length wide, a shared feed-forward
    TinyRouted("hunyuan-moe", n_rot=16, n_dense_lead=0, n_expert_used=3, metadata={"expert_weights_scale": 2.0}),
    TinyRouted("hunyuan-dense", n_rot=16, n_layer=3, metadata={"rope.scaling.alpha": 1000.0}),
    # PhiMoE: Phi 3's graph, biases everywhere, softmax routing normalised
    TinyRouted("phimoe", n_embd=64, n_rot=16, n_dense_lead=0, n_expert=16, n_expert_used=2),
    # SmallThinker: ReGLU experts routed on the block's input; its window and RoPE-less layers
    TinyRouted("smallthinker", n_rot=16, n_layer=3, n_dense_lead=0, types=MIXED, n_embd=256,
               metadata={"expert_gating_func": 2, "attention.sliding_window": 4096}),
]


@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@example(spec=EXAMPLES[0])
@example(spec=EXAMPLES[1])
@example(spec=EXAMPLES[2])
@example(spec=EXAMPLES[3])
@example(spec=EXAMPLES[4])
@example(spec=EXAMPLES[5])
@example(spec=EXAMPLES[6])
@example(spec=EXAMPLES[7])
@given(spec=tiny_routed_models())
def test_routed_experts_give_llama_cpps_logits(tmp_path, spec):
    require_peer()
    path = tmp_path / f"{spec.arch}.gguf"
    write_tiny_routed(spec, path, np.random.default_rng(5))
    with Model.load(path) as model:
        assert model.hparams.n_layer == spec.n_layer
        check_logits_against_llama_cpp(model, path, TOKENS)


def test_glm4moe_checks(tmp_path):
    """As llama.cpp loads it: every expert layer has its selection bias; the NextN blocks leave
    at least one block to run."""
    from test_model_loading import rewrite

    path = tmp_path / "glm4moe.gguf"
    write_tiny_routed(TinyRouted(nextn=1), path, np.random.default_rng(0))
    with Model.load(path) as model:
        assert (model.hparams.n_layer, model.hparams.n_layer_nextn, model.hparams.expert_gating_func) == (2, 1, 2)
    with pytest.raises(ModelLoadError, match="blk.1.exp_probs_b.bias"):
        Model.load(rewrite(path, tmp_path / "a.gguf", drop_tensors={"blk.1.exp_probs_b.bias"}))
    with pytest.raises(ModelLoadError, match="nextn_predict_layers"):
        Model.load(rewrite(path, tmp_path / "b.gguf", set_keys={"glm4moe.nextn_predict_layers": 3}))
