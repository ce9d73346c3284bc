"""Mistral 3 (attention temperature) and Apertus (xIELU): the named steps against numpy forms,
and tiny random models against llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest

from _llama import require_peer
from gguflm import Model
from gguflm._ext.plan import Plan
from gguflm.errors import ModelLoadError
from gguflm.ggml_types import GGMLType
from test_alibi import check_against_llama_cpp
from tiny_models import TinyModel, write_tiny_apertus, write_tiny_model

F32 = np.float32


def softplus(x: float) -> np.float32:
    x = F32(x)
    return x if x > 20 else F32(np.log(F32(1) + np.exp(x)))


def xielu_reference(x: np.ndarray, alpha_n: float, alpha_p: float, beta: float, eps: float) -> np.ndarray:
    """xIELU as ggml_xielu defines it, in float64 from the float32 parameters it derives."""
    a_n, a_p, b = float(F32(beta) + softplus(alpha_n)), float(softplus(alpha_p)), float(F32(beta))
    x = x.astype(np.float64)
    neg = (np.expm1(np.minimum(x, float(F32(eps)))) - x) * a_n + b * x
    return np.where(x > 0, a_p * x * x + b * x, neg)


@pytest.mark.parametrize("params", [(0.8, 0.8, 0.5, -1e-6), (-2.0, 25.0, 0.0, 0.0), (30.0, -1.0, 1.5, -0.5)])
def test_xielu_matches_its_numpy_form(params):
    """Both sides (x > 0: a quadratic; else expm1), the softplus branch past 20, eps capping x."""
    x = np.random.default_rng(0).standard_normal((7, 93)).astype(F32) * 3
    x[0, :5] = [0.0, -0.0, 1e-30, -1e-30, -50.0]
    plan = Plan(7, 1, 1)
    out = x.copy()
    plan.xielu(out, np.array(params, F32))
    plan.run()
    np.testing.assert_allclose(out, xielu_reference(x, *params), rtol=2e-6, atol=1e-7)


def test_attention_temperature_matches_its_numpy_form():
    """Row i scaled by log(floor((pos_i + offset) / floor_scale) + 1) * scale + 1 of its position."""
    pos = np.array([0, 1, 8191, 8192, 8193, 40000, 123456], np.int32)
    plan = Plan(len(pos), 1, 1)
    plan.pos[:] = pos
    q = np.random.default_rng(1).standard_normal((len(pos), 24)).astype(F32)
    out = q.copy()
    plan.attn_temp(out, 0.1, 0.0, 8192)
    plan.run()
    s = (np.log(np.floor((pos.astype(F32) + F32(0)) / F32(8192)).astype(np.float64) + 1.0) * float(F32(0.1)) + 1.0).astype(F32)
    np.testing.assert_array_equal(out, q * s[:, None])
    assert s[0] == 1 and s[-1] > 1


@pytest.mark.parametrize("metadata", [{}, {"attention.temperature_scale": 0.5, "rope.scaling.original_context_length": 4}])
def test_mistral3_gives_llama_cpps_logits(tmp_path, metadata):
    """Llama's block; with a temperature over windows of 4 positions, the queries grow along
    the prompt (a short original context, so that the 21 tokens cross several windows)."""
    require_peer()
    path = tmp_path / "mistral3.gguf"
    write_tiny_model(TinyModel("mistral3", n_embd=64, head_dim=16, n_head=4, n_head_kv=2, n_ff=64, n_layer=2,
                               tied_output=False, metadata=metadata,
                               types={"attn_q": GGMLType.Q8_0, "ffn_down": GGMLType.Q4_0}),
                     path, np.random.default_rng(6))
    check_against_llama_cpp(path, threads=(1, 3))


def test_mistral3_temperature_needs_an_original_context(tmp_path):
    path = tmp_path / "mistral3.gguf"
    write_tiny_model(TinyModel("mistral3", n_embd=64, head_dim=16, n_head=4, n_head_kv=2, n_ff=64, n_layer=1,
                               metadata={"attention.temperature_scale": 0.5, "rope.scaling.original_context_length": 0}),
                     path, np.random.default_rng(0))
    with pytest.raises(ModelLoadError, match="original_context_length"):
        Model.load(path)


@pytest.mark.parametrize("xielu", [None, {"alpha_n": [0.8, 2.0], "alpha_p": [0.8, -0.5], "beta": 0.5, "eps": [-1e-6, -0.2]}])
def test_apertus_gives_llama_cpps_logits(tmp_path, xielu):
    """One set of xIELU parameters for all layers, or one per layer."""
    require_peer()
    path = tmp_path / "apertus.gguf"
    write_tiny_apertus(path, np.random.default_rng(3), xielu=xielu, types={"ffn_up": GGMLType.Q8_0})
    check_against_llama_cpp(path, threads=(1, 2))


@pytest.mark.parametrize("fused", [True, False])
def test_chatglm_gives_llama_cpps_logits(tmp_path, fused):
    """A fused QKV with its bias, or Q, K and V apart with theirs; RoPE over half of each head."""
    from tiny_models import write_tiny_chatglm

    require_peer()
    path = tmp_path / "chatglm.gguf"
    write_tiny_chatglm(path, np.random.default_rng(8), fused=fused, tied_output=not fused,
                       types={"attn_qkv": GGMLType.Q8_0, "ffn_up": GGMLType.Q4_1})
    check_against_llama_cpp(path, threads=(1, 2))


@pytest.mark.parametrize("n_head_kv", [4, 2])
def test_jina_bert_v3_gives_llama_cpps_embeddings(tmp_path, n_head_kv):
    """Three sequences in one batch: every token's row (pooling none) and their means, as
    llama.cpp's, bit for bit."""
    from _llama import llama_embeddings
    from test_embeddings import bits_equal, context_embeddings
    from tiny_models import write_tiny_jina_bert_v3

    require_peer()
    path = tmp_path / "jina-bert-v3.gguf"
    write_tiny_jina_bert_v3(path, np.random.default_rng(9), n_head_kv=n_head_kv, types={"attn_q": GGMLType.Q8_0})
    rng = np.random.default_rng(1)
    seqs = [[1] + rng.integers(3, 300, n).tolist() for n in (7, 12, 3)]
    with Model.load(path) as model:
        for pooling, code in (("none", 0), ("mean", 1)):
            ours = context_embeddings(model, seqs, pooling, n_threads=2)
            theirs = llama_embeddings(path, seqs, code)
            for o, t in zip(ours, theirs):
                assert bits_equal(o, t), pooling
