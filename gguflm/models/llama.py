"""Llama (Llama 2/3, Mistral, SmolLM, TinyLlama): RMSNorm, RoPE (adjacent pairs), GQA, SwiGLU.

Its forward pass also serves the architectures built on the same block (Qwen 2's Q/K/V biases,
Qwen 3's per-head Q/K norms run when their tensors are present)."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParams, RopeType
from gguflm.models.base import Architecture, TensorSpec


class Llama(Architecture):
    name = "llama"
    rope_type = RopeType.NORM

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        # Llama 3.1's long-context RoPE frequency factors, shared by all layers
        specs.append(TensorSpec("rope_freqs.weight", (hp.n_rot // 2,), optional=True))
        for il in range(hp.n_layer):
            specs.append(TensorSpec(f"blk.{il}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.attention_specs(hp, il, bias=None)
            specs.append(TensorSpec(f"blk.{il}.ffn_norm.weight", (hp.n_embd,)))
            specs += cls.ffn_specs(hp, il)
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            # self-attention
            cur = g.rms_norm(x, L.attn_norm)
            q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)            # [n_tokens, n_head(_kv) * head_dim]
            for t, bias in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
                g.add_bias(t, bias)
            g.rope(g.rms_norm_heads(q, L.attn_q_norm), il, hp.n_head[il])
            g.rope(g.rms_norm_heads(k, L.attn_k_norm), il, hp.n_head_kv[il])
            cur = g.attention(il, q, k, v, hp.kq_scale)                       # [n_tokens, n_head * head_dim]
            cur = g.linear(cur, L.attn_output, L.attn_output_bias)            # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                # [n_outputs, n_embd]
            g.add(x, cur)
            # feed-forward
            cur = g.rms_norm(x, L.ffn_norm)
            gate, up = g.project(cur, L.ffn_gate, L.ffn_up)                   # [n, n_ff]
            (cur,) = g.project(g.swiglu(gate, up), L.ffn_down)                # [n, n_embd]
            g.add(x, cur)
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]
