"""StarCoder 2: LayerNorms with biases, biased attention output and a biased GELU feed-forward
(up, GELU, down; no gate), split-half RoPE, Q/K/V biases where the file has them."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParams, RopeType
from gguflm.models.base import Architecture, TensorSpec


class StarCoder2(Architecture):
    name = "starcoder2"
    rope_type = RopeType.NEOX
    heads_span_embd = requires_layer_norm_eps = True

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e = hp.n_embd
        specs = cls.output_specs(hp)
        specs.insert(2, TensorSpec("output_norm.bias", (e,)))
        for il in range(hp.n_layer):
            blk, f = f"blk.{il}", hp.n_ff[il]
            specs += cls.norm_specs(f"{blk}.attn_norm", e)
            specs += cls.attention_specs(hp, il, bias=None)
            specs += cls.norm_specs(f"{blk}.ffn_norm", e)
            specs += [TensorSpec(f"{blk}.ffn_down.weight", (f, e)), TensorSpec(f"{blk}.ffn_up.weight", (e, f)),
                      TensorSpec(f"{blk}.ffn_down.bias", (e,)), TensorSpec(f"{blk}.ffn_up.bias", (f,))]
        # the attention output bias is required here: replace attention_specs' optional one
        return list({s.name: s for s in specs + [TensorSpec(f"blk.{il}.attn_output.bias", (e,))
                                                  for il in range(hp.n_layer)]}.values())

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            # self-attention
            cur = g.layer_norm(x, L.attn_norm, L.attn_norm_bias)
            q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)            # [n_tokens, n_head(_kv) * head_dim]
            for t, bias in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
                g.add_bias(t, bias)
            g.rope(q, il, hp.n_head[il])
            g.rope(k, il, hp.n_head_kv[il])
            cur = g.attention(il, q, k, v, hp.kq_scale)                       # [n_tokens, n_embd]
            cur = g.linear(cur, L.attn_output, L.attn_output_bias)
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                # [n_outputs, n_embd]
            g.add(x, cur)
            # feed-forward: up, GELU, down
            cur = g.layer_norm(x, L.ffn_norm, L.ffn_norm_bias)
            cur = g.gelu(g.linear(cur, L.ffn_up, L.ffn_up_bias))              # [n, n_ff]
            g.add(x, g.linear(cur, L.ffn_down, L.ffn_down_bias))              # [n, n_embd]
        x = g.layer_norm(x, m.tensors["output_norm.weight"], m.tensors["output_norm.bias"])
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]
