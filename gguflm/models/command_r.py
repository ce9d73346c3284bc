"""Command R (Cohere): one LayerNorm (no bias) feeding attention and a SwiGLU feed-forward in
parallel, each added to the residual (feed-forward first), adjacent-pair RoPE, the token
embedding as output projection, logits multiplied by ``logit_scale``; Command R+ (64 layers or
more, as llama.cpp tells them apart) LayerNorms every head of Q and K before RoPE."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamReader, HParams, RopeType
from gguflm.models.base import Architecture, TensorSpec

# llama.cpp gives the models of this many layers (Command R+) per-head Q/K LayerNorms
QK_NORM_LAYERS = 64


class CommandR(Architecture):
    name = "command-r"
    rope_type = RopeType.NORM
    untied_output = False
    heads_span_embd = requires_layer_norm_eps = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        return hp.with_changes(f_logit_scale=kv.get_float("{arch}.logit_scale", 0.0))

    @staticmethod
    def qk_norm(hp: HParams) -> bool:
        """Whether Q and K are LayerNormed per head (Command R+)."""
        return hp.n_layer >= QK_NORM_LAYERS

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            specs.append(TensorSpec(f"blk.{il}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.qkv_specs(hp, il)
            specs.append(TensorSpec(f"blk.{il}.attn_output.weight", (hp.n_embd, hp.n_embd)))
            if cls.qk_norm(hp):  # one row of weights per head
                specs += [TensorSpec(f"blk.{il}.attn_q_norm.weight", (hp.n_embd_head_k, hp.n_head[il])),
                          TensorSpec(f"blk.{il}.attn_k_norm.weight", (hp.n_embd_head_k, hp.n_head_kv[il]))]
            specs += cls.ffn_specs(hp, il)
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            normed = g.layer_norm(x, L.attn_norm, None)
            # self-attention
            q, k, v = g.project(normed, L.attn_q, L.attn_k, L.attn_v)         # [n_tokens, n_head(_kv) * head_dim]
            for t, bias in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
                g.add_bias(t, bias)
            if self.qk_norm(hp):
                dk = hp.n_embd_head_k
                q, k = g.layer_norm_heads(q, L.attn_q_norm, dk), g.layer_norm_heads(k, L.attn_k_norm, dk)
            g.rope(q, il, hp.n_head[il])
            g.rope(k, il, hp.n_head_kv[il])
            cur = g.attention(il, q, k, v, hp.kq_scale)                       # [n_tokens, n_embd]
            (cur,) = g.project(cur, L.attn_output)
            if il == hp.n_layer - 1:
                x, cur, normed = g.output_rows(x, cur, normed)                # [n_outputs, n_embd]
            # feed-forward on the same normed input
            gate, up = g.project(normed, L.ffn_gate, L.ffn_up)                # [n, n_ff]
            (ffn,) = g.project(g.swiglu(gate, up), L.ffn_down)                # [n, n_embd]
            x = g.add(g.add(ffn, x), cur)                                     # (ffn + residual) + attention
        x = g.layer_norm(x, m.tensors["output_norm.weight"], None)
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]
