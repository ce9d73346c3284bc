"""Falcon: attention and a GELU feed-forward (up, GELU, down; no biases) side by side on one
LayerNorm of the residual, a fused QKV projection, split-half RoPE; Falcon-40B gives attention a
second LayerNorm of its own (``attn_norm_2``)."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParams, RopeType
from gguflm.models.base import Architecture, TensorSpec


class Falcon(Architecture):
    name = "falcon"
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
            specs += cls.norm_specs(f"{blk}.attn_norm_2", e, optional=True)
            specs += [TensorSpec(f"{blk}.attn_qkv.weight", (e, e + hp.n_embd_k_gqa(il) + hp.n_embd_v_gqa(il))),
                      TensorSpec(f"{blk}.attn_output.weight", (e, e)),
                      TensorSpec(f"{blk}.ffn_down.weight", (f, e)), TensorSpec(f"{blk}.ffn_up.weight", (e, f))]
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            normed = g.layer_norm(x, L.attn_norm, L.attn_norm_bias)
            # self-attention, on a norm of its own where the block has one (Falcon-40B)
            cur = normed if L.attn_norm_2 is None else g.layer_norm(x, L.attn_norm_2, L.attn_norm_2_bias)
            (qkv,) = g.project(cur, L.attn_qkv)                               # [n_tokens, n_embd + 2 * n_embd_gqa]
            q, k, v = g.split(qkv, hp.n_embd, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il))
            g.rope_qk(q, k, il)
            cur = g.attention(il, q, k, v, hp.kq_scale)                       # [n_tokens, n_embd]
            (cur,) = g.project(cur, L.attn_output)
            if il == hp.n_layer - 1:
                x, cur, normed = g.output_rows(x, cur, normed)                # [n_outputs, n_embd]
            # feed-forward on the first norm: up, GELU, down
            (up,) = g.project(normed, L.ffn_up)                               # [n, n_ff]
            (ffn,) = g.project(g.gelu(up), L.ffn_down)                        # [n, n_embd]
            x = g.add(g.add(ffn, cur), x)                                     # (ffn + attention) + residual
        x = g.layer_norm(x, m.tensors["output_norm.weight"], m.tensors["output_norm.bias"])
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]
