"""Gemma 4's experts (the 26B-A4B's layers) against llama.cpp.

Tiny random models (tests/tiny_models.py's :class:`TinyGemma` with ``n_expert``; weight types
mixed per tensor, routers of spread rows so that no rounding could flip an expert) give
llama.cpp's logits (llama-cpp-python) to the bit at every position, in ubatches of 1, 5 and the
whole prompt, at 1 to 3 threads, and for two sequences decoded together: the experts beside the
dense feed-forward, the router on the attention output normed without a weight and scaled,
gate and up as one tensor or two, the per-expert down scale, layers with and without experts.
"""

from __future__ import annotations

import numpy as np
import pytest

from _llama import require_peer
from _memory_pair import MemoryPair
from gguflm import Model
from gguflm.ggml_types import GGMLType
from gguflm.loader import MissingTensorError
from test_invariance import llama_cpp_logits, prompt_logits
from test_model_loading import rewrite
from tiny_models import TinyGemma, write_tiny_gemma

PROMPT = [1] + list(range(20, 37))
MIXED = {"attn_q": GGMLType.Q8_0, "attn_k": GGMLType.Q4_0, "attn_v": GGMLType.Q5_1, "attn_output": GGMLType.Q5_0,
         "ffn_gate": GGMLType.Q6_K, "ffn_up": GGMLType.IQ4_NL, "ffn_down": GGMLType.Q4_K, "ffn_gate_inp": GGMLType.F32,
         "ffn_gate_exps": GGMLType.Q4_K, "ffn_up_exps": GGMLType.Q8_0, "ffn_down_exps": GGMLType.Q5_0,
         "ffn_gate_up_exps": GGMLType.Q6_K, "token_embd": GGMLType.Q8_0, "output": GGMLType.Q6_K}
CASES = {
    # as the 26B-A4B: experts in every layer, gate and up as one, each expert's output scaled
    "fused-mixed": TinyGemma("gemma4", n_embd=256, head_dim=64, head_dim_swa=32, n_head=4, n_head_kv=2, n_ff=256,
                             n_layer=3, swa_period=3, n_swa=4, n_rot_swa=16, n_head_kv_global=1, n_expert=8,
                             n_expert_used=3, n_ff_exp=64, gate_up=True, types=MIXED, tied_output=False),
    # gate and up apart, no down scale, a dense layer between expert layers
    "split-some-layers": TinyGemma("gemma4", n_embd=64, head_dim=32, head_dim_swa=16, n_rot=16, n_layer=3, n_swa=5,
                                   n_expert=6, n_expert_used=2, n_ff_exp=32, expert_layers=(0, 2), down_scale=False,
                                   no_v_layers=(1,)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def gemma4_moe(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4-moe") / "gemma4.gguf"
    write_tiny_gemma(CASES[request.param], path, np.random.default_rng(3))
    with Model.load(path) as model:
        yield request.param, path, model


def test_gemma4_experts_give_llama_cpps_logits(gemma4_moe):
    """Every position, in ubatches of 1, 5 and the whole prompt: llama.cpp's logits to the bit,
    the same floats at 1 and 3 threads."""
    require_peer()
    name, path, model = gemma4_moe
    spec = CASES[name]
    assert (model.hparams.n_expert, model.hparams.n_expert_used, model.hparams.n_ff_exp) == \
        (spec.n_expert, spec.n_expert_used, spec.n_ff_exp)
    assert [model.layers[il].ffn_gate_inp is not None for il in range(spec.n_layer)] == \
        [spec.has_experts(il) for il in range(spec.n_layer)]
    for n_ubatch in (1, 5, len(PROMPT)):
        ours = prompt_logits(model, PROMPT, 2, n_ubatch, "f16", "f16")
        np.testing.assert_array_equal(ours, llama_cpp_logits(path, PROMPT, n_ubatch, "f16", "f16"),
                                      err_msg=f"ubatch {n_ubatch}")
        for n_threads in (1, 3) if n_ubatch == 5 else ():
            np.testing.assert_array_equal(prompt_logits(model, PROMPT, n_threads, n_ubatch, "f16", "f16"), ours)


def test_gemma4_experts_over_two_sequences(gemma4_moe):
    """Two sequences in one batch, then a token of each and two of one: llama.cpp's logits."""
    _, path, _ = gemma4_moe
    a, b = PROMPT[:11], PROMPT[4:13]
    steps = [[(t, p, 0, True) for p, t in enumerate(a)] + [(t, p, 1, True) for p, t in enumerate(b)],
             [(40, 11, 0, True), (41, 9, 1, True)], [(42, 12, 0, True), (43, 13, 0, True)]]
    with MemoryPair(path, n_seq=2) as both:
        for entries in steps:
            both.decode(entries)


@pytest.mark.parametrize("drop", ["blk.0.ffn_down_exps.weight", "blk.0.ffn_gate_inp.scale", "blk.2.pre_ffw_norm_2.weight",
                                  "blk.0.ffn_up_exps.weight", "blk.2.ffn_gate_inp.weight"])
def test_a_layer_with_a_router_needs_its_experts(tmp_path, drop):
    """As llama.cpp loads a layer that has ``ffn_gate_inp``: the missing tensor is named; a layer
    with experts and no router is refused too (llama.cpp: wrong number of tensors)."""
    path = tmp_path / "gemma4.gguf"
    write_tiny_gemma(CASES["split-some-layers"], path, np.random.default_rng(0))
    with pytest.raises(MissingTensorError, match=drop.replace(".", r"\.")):
        Model.load(rewrite(path, tmp_path / "dropped.gguf", drop_tensors={drop}))


def test_gemma4_reads_the_26b_a4b_expert_keys(vocab_dir):
    """The 26B-A4B's metadata (tests/data/vocab) loads up to the tensors the vocabulary file lacks,
    its experts read from the file's keys."""
    from gguflm.gguf import GGUFReader
    from gguflm.hparams import HParamReader
    from gguflm.models.gemma4 import Gemma4

    path = vocab_dir / "ggml-vocab-gemma-4.gguf"
    with pytest.raises(MissingTensorError):
        Model.load(path)
    with GGUFReader(path) as r:
        meta = r.metadata
    hp = Gemma4.read_hparams(HParamReader("gemma4", meta, path.name), 262144)
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == (meta["gemma4.expert_count"],
                                                            meta["gemma4.expert_used_count"],
                                                            meta["gemma4.expert_feed_forward_length"])
