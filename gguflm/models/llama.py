"""Llama (Llama 2/3, Mistral, SmolLM, TinyLlama; Mixtral with experts): RMSNorm, RoPE (adjacent
pairs), GQA, SwiGLU, or a mixture of SwiGLU experts where the file has ``expert_count``.

Its forward pass also serves the architectures built on the same block (Qwen 2's Q/K/V biases,
Qwen 3's per-head Q/K norms and OLMoE's full-width ones, where the architecture declares them; the
mixture-of-experts variants, with a shared expert where there is one; Granite's scales)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from gguflm.graph import GATING_SOFTMAX, Graph
from gguflm.hparams import HParamReader, HParams, RopeType, read_expert_hparams
from gguflm.models.base import Architecture, TensorSpec

if TYPE_CHECKING:
    from gguflm.model import Layer


class Llama(Architecture):
    name = "llama"
    rope_type = RopeType.NORM
    # mixture of experts: routing as build_moe_ffn's arguments in llama.cpp's graph of the arch
    expert_gating: ClassVar[int] = GATING_SOFTMAX
    norm_expert_weights: ClassVar[bool] = True
    # the optional parts of the block this graph runs, as the architecture declares their tensors:
    # attention biases (attention_specs' bias: None optional, True required, False none), Q/K
    # RMS norms before RoPE, a sigmoid gate on the shared expert
    attention_bias: ClassVar[bool | None] = None
    # whether the graph adds attn_output.bias where the file has one (ERNIE 4.5's graph reads it
    # but never adds it)
    attention_output_bias: ClassVar[bool] = True
    qk_norm: ClassVar[bool] = False
    # Hunyuan normalises Q and K after RoPE, the others before
    qk_norm_after_rope: ClassVar[bool] = False
    shared_expert_gate: ClassVar[bool] = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        return cls.read_experts(kv, super().read_hparams(kv, n_vocab))

    @classmethod
    def read_experts(cls, kv: HParamReader, hp: HParams) -> HParams:
        """Mixtral: llama with ``expert_count``; its experts are feed_forward_length wide."""
        return read_expert_hparams(kv, hp, required=False, n_ff_exp_key=False)

    @classmethod
    def has_experts(cls, hp: HParams, il: int) -> bool:
        """Whether block ``il`` routes to experts (else its feed-forward is dense)."""
        return bool(hp.n_expert)

    @classmethod
    def ffn_or_expert_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        """The dense feed-forward, or the experts (and the shared expert, if any)."""
        if not cls.has_experts(hp, il):
            return cls.ffn_specs(hp, il)
        specs = cls.expert_specs(hp, il)
        if hp.n_ff_shexp:
            specs += cls.shared_expert_specs(hp, il, hp.n_ff_shexp)
        return specs

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        # Llama 3.1's long-context RoPE frequency factors, shared by all layers
        specs.append(TensorSpec("rope_freqs.weight", (hp.n_rot // 2,), optional=True))
        for il in range(hp.n_layer):
            specs.append(TensorSpec(f"blk.{il}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.attention_specs(hp, il, bias=cls.attention_bias)
            specs.append(TensorSpec(f"blk.{il}.ffn_norm.weight", (hp.n_embd,)))
            specs += cls.ffn_or_expert_specs(hp, il)
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = g.embed(m.tensors["token_embd.weight"], scale=hp.f_embedding_scale)  # [n_tokens, n_embd]
        for il, L in g.layers():
            # self-attention
            cur = g.rms_norm(x, L.attn_norm)
            q, k, v = self.qkv(g, cur, L)                                     # [n_tokens, n_head(_kv) * head_dim]
            biased = self.attention_bias is not False
            if self.qk_norm_after_rope:
                g.rope_qk(q, k, il)
                g.rms_norm_heads(k, L.attn_k_norm)
                g.rms_norm_heads(q, L.attn_q_norm)
            else:
                g.rope_qk(q, k, il, *((L.attn_q_norm, L.attn_k_norm) if self.qk_norm else ()))
            g.attn_temperature(q)                                             # Mistral 3's, where it has one
            cur = g.attention(il, q, k, v, hp.kq_scale)                       # [n_tokens, n_head * head_dim]
            out_bias = L.attn_output_bias if biased and self.attention_output_bias else None
            cur = g.linear(cur, L.attn_output, out_bias)                      # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                # [n_outputs, n_embd]
            g.add(x, self.residual(g, cur))
            # feed-forward: dense, or experts
            cur = self.ffn(g, g.rms_norm(x, L.ffn_norm), L, il)               # [n, n_embd]
            g.add(x, self.residual(g, cur))
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]

    def ffn(self, g: Graph, cur: np.ndarray, L: Layer, il: int) -> np.ndarray:
        """The normed input's feed-forward: the layer's experts, or its dense SwiGLU."""
        if self.has_experts(g.hparams, il):
            return self.experts(g, cur, L)                                    # [n, n_embd]
        gate, up = g.project(cur, L.ffn_gate, L.ffn_up)                       # [n, n_ff]
        return g.project(g.swiglu(gate, up), L.ffn_down)[0]                   # [n, n_embd]

    def qkv(self, g: Graph, cur: np.ndarray, L: Layer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q, K and V of the normed input, with their biases where the architecture has them."""
        q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)
        if self.attention_bias is not False:
            for t, bias in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
                g.add_bias(t, bias)
        return q, k, v

    @staticmethod
    def residual(g: Graph, cur: np.ndarray) -> np.ndarray:
        """A branch's output before it joins the residual stream (Granite scales it)."""
        if g.hparams.f_residual_scale:
            g.scale(cur, g.hparams.f_residual_scale)
        return cur

    def routing(self, hp: HParams, L: Layer) -> dict:
        """build_moe_ffn's gating, weight normalisation, scale and selection bias for this
        architecture."""
        return {"gating": self.expert_gating, "norm_w": self.norm_expert_weights}

    def experts(self, g: Graph, cur: np.ndarray, L: Layer) -> np.ndarray:
        """The routed experts, plus the shared expert where the layer has one (its output
        scaled by a sigmoid gate where it has ``ffn_gate_inp_shexp``)."""
        out = g.moe_ffn(cur, L, **self.routing(g.hparams, L))
        if g.hparams.n_ff_shexp:
            gate, up = g.project(cur, L.ffn_gate_shexp, L.ffn_up_shexp)      # [n, n_ff_shexp]
            (shared,) = g.project(g.swiglu(gate, up), L.ffn_down_shexp)      # [n, n_embd]
            if self.shared_expert_gate:
                g.shared_expert_gate(cur, shared, L.ffn_gate_inp_shexp)
            g.add(out, shared)
        return out


class RoutedExperts:
    """DeepSeek's mixture of experts, mixed into an architecture built on :class:`Llama`'s
    feed-forward (its hyper-parameters from :func:`gguflm.hparams.read_routed_expert_hparams`):
    dense SwiGLU layers first, then experts routed as the file says (gating, the selection bias
    ``exp_probs_b`` where a layer has one, normalised and scaled weights, group-limited where the
    file groups them) beside ungated shared experts."""

    # whether llama.cpp requires every expert layer's selection bias (else it may be absent)
    probs_bias_required: ClassVar[bool] = False

    def routing(self, hp: HParams, L: Layer) -> dict:
        return {"gating": hp.expert_gating_func, "norm_w": hp.expert_weights_norm,
                "w_scale": hp.expert_weights_scale, "selection_bias": L.exp_probs_b_bias}

    @classmethod
    def has_experts(cls, hp: HParams, il: int) -> bool:
        return il >= hp.n_layer_dense_lead

    @classmethod
    def ffn_or_expert_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        if not cls.has_experts(hp, il):
            return Architecture.ffn_specs(hp, il)
        shared = Architecture.shared_expert_specs(hp, il, hp.n_ff_shexp) if hp.n_ff_shexp else []
        return (Architecture.expert_specs(hp, il) + shared
                + [TensorSpec(f"blk.{il}.exp_probs_b.bias", (hp.n_expert,), optional=not cls.probs_bias_required)])
