"""Phi 2: one LayerNorm (with bias) feeding attention and a biased GELU feed-forward in parallel,
both added to the residual; fused or separate Q, K, V with biases, partial split-half RoPE,
queries scaled before attention, a biased output projection."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParams, RopeType
from gguflm.models.base import Architecture, TensorSpec


class Phi2(Architecture):
    name = "phi2"
    rope_type = RopeType.NEOX
    required_output = True
    heads_span_embd = requires_layer_norm_eps = True

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e = hp.n_embd
        specs = cls.output_specs(hp) + [TensorSpec("output_norm.bias", (e,)), TensorSpec("output.bias", (hp.n_vocab,))]
        for il in range(hp.n_layer):
            blk, f, n_qkv = f"blk.{il}", hp.n_ff[il], e + 2 * hp.n_embd_k_gqa(il)
            specs += cls.norm_specs(f"{blk}.attn_norm", e)
            specs += [TensorSpec(f"{blk}.attn_qkv.weight", (e, n_qkv), optional=True),
                      TensorSpec(f"{blk}.attn_qkv.bias", (n_qkv,), optional=True)]
            specs += cls.qkv_specs(hp, il, optional=True)
            specs += [TensorSpec(f"{blk}.attn_output.weight", (e, e)), TensorSpec(f"{blk}.attn_output.bias", (e,)),
                      TensorSpec(f"{blk}.ffn_down.weight", (f, e)), TensorSpec(f"{blk}.ffn_down.bias", (e,)),
                      TensorSpec(f"{blk}.ffn_up.weight", (e, f)), TensorSpec(f"{blk}.ffn_up.bias", (f,))]
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        dk = hp.n_embd_head_k
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            normed = g.layer_norm(x, L.attn_norm, L.attn_norm_bias)
            # self-attention
            if L.attn_qkv is not None:
                qkv = g.linear(normed, L.attn_qkv, L.attn_qkv_bias)           # [n_tokens, n_embd + 2 * n_embd_gqa]
                q, k, v = g.split(qkv, hp.n_head[il] * dk, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il))
            else:
                q, k, v = g.project(normed, L.attn_q, L.attn_k, L.attn_v)
                for t, bias in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
                    g.add_bias(t, bias)
            g.rope(q, il, hp.n_head[il])
            g.rope(k, il, hp.n_head_kv[il])
            g.scale(q, hp.kq_scale)
            cur = g.attention(il, q, k, v, 1.0)                               # [n_tokens, n_embd]
            cur = g.linear(cur, L.attn_output, L.attn_output_bias)
            if il == hp.n_layer - 1:
                x, cur, normed = g.output_rows(x, cur, normed)                # [n_outputs, n_embd]
            # feed-forward on the same normed input: up, GELU, down
            ffn = g.linear(g.gelu(g.linear(normed, L.ffn_up, L.ffn_up_bias)), L.ffn_down, L.ffn_down_bias)
            x = g.add(g.add(cur, ffn), x)                                     # (attention + ffn) + residual
        x = g.layer_norm(x, m.tensors["output_norm.weight"], m.tensors["output_norm.bias"])
        logits = g.logits(x, m.tensors["output.weight"])                      # [n_outputs, n_vocab]
        return x, logits if logits is None else g.add_bias(logits, m.tensors["output.bias"])
