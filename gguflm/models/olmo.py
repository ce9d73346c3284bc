"""OLMo (the first generation): Llama's block with LayerNorms that have neither weight nor bias
(before attention, before the feed-forward and at the end); Q, K and V clamped to
[-clamp_kqv, clamp_kqv] where the file sets ``attention.clamp_kqv``."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamReader, HParams
from gguflm.models.base import Architecture, TensorSpec


class Olmo(Architecture):
    name = "olmo"
    heads_span_embd = requires_layer_norm_eps = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        return hp.with_changes(f_clamp_kqv=kv.get_float("{arch}.attention.clamp_kqv", 0.0))

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = [s for s in cls.output_specs(hp) if s.name != "output_norm.weight"]
        for il in range(hp.n_layer):
            specs += cls.attention_specs(hp, il)
            specs += cls.ffn_specs(hp, il)
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            # self-attention
            cur = g.layer_norm(x, None, None)
            q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)            # [n_tokens, n_head(_kv) * head_dim]
            g.clamp_kqv(q, k, v)
            g.rope_qk(q, k, il)
            cur = g.attention(il, q, k, v, hp.kq_scale)                       # [n_tokens, n_embd]
            (cur,) = g.project(cur, L.attn_output)
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                # [n_outputs, n_embd]
            g.add(x, cur)
            # feed-forward
            gate, up = g.project(g.layer_norm(x, None, None), L.ffn_gate, L.ffn_up)  # [n, n_ff]
            (cur,) = g.project(g.swiglu(gate, up), L.ffn_down)                # [n, n_embd]
            g.add(x, cur)
        x = g.layer_norm(x, None, None)
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]
