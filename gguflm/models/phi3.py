"""Phi 3: fused QKV projection (or separate Q, K, V), fused gate-and-up FFN with SwiGLU over its
halves, split-half RoPE with optional long/short frequency factors. Like llama.cpp, the sliding
window some Phi 3 files declare is not used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamReader, HParams, RopeType, require_heads_span_embd
from gguflm.models.base import Architecture, TensorSpec

if TYPE_CHECKING:
    from gguflm.loader import Weight
    from gguflm.model import Layer


class Phi3(Architecture):
    name = "phi3"
    rope_type = RopeType.NEOX

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        require_heads_span_embd(kv, hp)
        return hp

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        specs += [TensorSpec("rope_factors_long.weight", (hp.n_rot // 2,), optional=True),
                  TensorSpec("rope_factors_short.weight", (hp.n_rot // 2,), optional=True)]
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            n_qkv = hp.n_embd + 2 * hp.n_embd_k_gqa(il)
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            specs.append(TensorSpec(f"{blk}.attn_qkv.weight", (hp.n_embd, n_qkv), optional=True))
            specs += [TensorSpec(s.name, s.shape, optional=True) for s in cls.attention_specs(hp, il)[:3]]
            specs += [
                TensorSpec(f"{blk}.attn_output.weight", (hp.n_embd, hp.n_embd)),
                TensorSpec(f"{blk}.ffn_norm.weight", (hp.n_embd,)),
                TensorSpec(f"{blk}.ffn_down.weight", (hp.n_ff[il], hp.n_embd)),
                TensorSpec(f"{blk}.ffn_up.weight", (hp.n_embd, 2 * hp.n_ff[il])),
            ]
        return specs

    # PhiMoE: biases on the norms, Q/K/V (where the file has them), the attention output and the logits
    biased: ClassVar[bool] = False

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        dk = hp.n_embd_head_k
        def bias(owner: Any, name: str) -> Weight | None:   # where the architecture has them
            if not self.biased:
                return None
            return owner[name] if isinstance(owner, dict) else getattr(owner, name)

        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            # self-attention
            cur = g.add_bias(g.rms_norm(x, L.attn_norm), bias(L, 'attn_norm_bias'))
            if L.attn_qkv is not None:
                (qkv,) = g.project(cur, L.attn_qkv)                           # [n_tokens, n_embd + 2 * n_embd_gqa]
                q, k, v = g.split(qkv, hp.n_head[il] * dk, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il))
            else:
                q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)
                if self.biased:
                    for t, b in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
                        g.add_bias(t, b)
            g.rope(q, il, hp.n_head[il])
            g.rope(k, il, hp.n_head_kv[il])
            g.scale(q, hp.kq_scale)
            cur = g.attention(il, q, k, v, 1.0)                               # [n_tokens, n_embd]
            cur = g.linear(cur, L.attn_output, bias(L, 'attn_output_bias'))
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                # [n_outputs, n_embd]
            g.add(x, cur)
            cur = g.add_bias(g.rms_norm(x, L.ffn_norm), bias(L, 'ffn_norm_bias'))
            g.add(x, self.ffn(g, cur, L, il))                                 # [n, n_embd]
        x = g.add_bias(g.rms_norm(x, m.tensors["output_norm.weight"]), bias(m.tensors, "output_norm.bias"))
        logits = g.logits(x, m.tensors["output.weight"])                      # [n_outputs, n_vocab]
        return x, logits if logits is None else g.add_bias(logits, bias(m.tensors, "output.bias"))

    def ffn(self, g: Graph, cur: np.ndarray, L: Layer, il: int) -> np.ndarray:
        """The feed-forward: one matmul gives gate and up side by side."""
        (gate_up,) = g.project(cur, L.ffn_up)                                 # [n, 2 * n_ff]
        gate, up = g.split(gate_up, g.hparams.n_ff[il], g.hparams.n_ff[il])
        return g.project(g.swiglu(gate, up), L.ffn_down)[0]                   # [n, n_embd]
