"""StableLM (2): LayerNorms with biases, partial split-half RoPE, SwiGLU; optional per-head Q/K
LayerNorms; without an FFN norm (StableLM 2 12B) the feed-forward runs in parallel on the
attention's normed input."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParams, RopeType
from gguflm.models.base import Architecture, TensorSpec


class StableLM(Architecture):
    name = "stablelm"
    rope_type = RopeType.NEOX
    required_output = True
    heads_span_embd = requires_layer_norm_eps = True

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e, dk = hp.n_embd, hp.n_embd_head_k
        specs = cls.output_specs(hp) + [TensorSpec("output_norm.bias", (e,))]
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += cls.norm_specs(f"{blk}.attn_norm", e)
            specs += cls.qkv_specs(hp, il) + [TensorSpec(f"{blk}.attn_output.weight", (e, e))]
            specs += [TensorSpec(f"{blk}.attn_q_norm.weight", (dk, hp.n_head[il]), optional=True),
                      TensorSpec(f"{blk}.attn_k_norm.weight", (dk, hp.n_head_kv[il]), optional=True)]
            specs += cls.norm_specs(f"{blk}.ffn_norm", e, optional=True)
            specs += cls.ffn_specs(hp, il)
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        dk = hp.n_embd_head_k
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            normed = g.layer_norm(x, L.attn_norm, L.attn_norm_bias)
            # self-attention
            q, k, v = g.project(normed, L.attn_q, L.attn_k, L.attn_v)         # [n_tokens, n_head(_kv) * head_dim]
            for t, bias in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
                g.add_bias(t, bias)
            q, k = g.layer_norm_heads(q, L.attn_q_norm, dk), g.layer_norm_heads(k, L.attn_k_norm, dk)
            g.rope(q, il, hp.n_head[il])
            g.rope(k, il, hp.n_head_kv[il])
            cur = g.attention(il, q, k, v, hp.kq_scale)                       # [n_tokens, n_embd]
            (cur,) = g.project(cur, L.attn_output)
            if il == hp.n_layer - 1:
                x, cur, normed = g.output_rows(x, cur, normed)                # [n_outputs, n_embd]
            g.add(x, cur)
            # feed-forward: on its own norm, or in parallel on the attention's
            ffn_in = normed if L.ffn_norm is None else g.layer_norm(x, L.ffn_norm, L.ffn_norm_bias)
            gate, up = g.project(ffn_in, L.ffn_gate, L.ffn_up)                # [n, n_ff]
            (cur,) = g.project(g.swiglu(gate, up), L.ffn_down)                # [n, n_embd]
            g.add(x, cur)
        x = g.layer_norm(x, m.tensors["output_norm.weight"], m.tensors["output_norm.bias"])
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]
