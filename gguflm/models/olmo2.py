"""OLMo 2: no norm before attention or the FFN but RMS norms after each (before the residual
add), RMS norms over the whole Q and K rows, split-half RoPE; with ``sliding_window`` (OLMo 3)
three of every four layers slide."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType, swa_pattern
from gguflm.models.base import Architecture, TensorSpec


class Olmo2(Architecture):
    name = "olmo2"
    rope_type = RopeType.NEOX
    required_output = True
    heads_span_embd = True
    # Q and K RMS-normed over each head (EXAONE 4) rather than over the whole row
    qk_norm_per_head: ClassVar[bool] = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        n_swa = kv.get_int("{arch}.attention.sliding_window", 0)
        if n_swa <= 0:
            return hp
        if hp.rope_scaling_type == "yarn":   # its window layers would drop YaRN, which gguflm does not split
            raise HParamError(f"{kv.source}: olmo2 with a sliding window and YaRN RoPE scaling is not supported")
        # sliding layers rotate without the context's frequency scale (olmo2.cpp)
        return hp.with_changes(n_swa=n_swa, swa_layers=swa_pattern(hp.n_layer, 4),
                               rope_freq_base_train_swa=kv.get_float("{arch}.rope.freq_base_swa",
                                                                     hp.rope_freq_base_train),
                               rope_freq_scale_train_swa=1.0)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += cls.attention_specs(hp, il)                  # llama.cpp declares no biases
            specs += [TensorSpec(f"{blk}.attn_q_norm.weight", (hp.n_embd,)),
                      TensorSpec(f"{blk}.attn_k_norm.weight", (hp.n_embd_k_gqa(il),)),
                      TensorSpec(f"{blk}.post_attention_norm.weight", (hp.n_embd,))]
            specs += cls.ffn_specs(hp, il)
            specs.append(TensorSpec(f"{blk}.post_ffw_norm.weight", (hp.n_embd,)))
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            # self-attention on the residual stream itself, normed after
            q, k, v = g.project(x, L.attn_q, L.attn_k, L.attn_v)              # [n_tokens, n_head(_kv) * head_dim]
            if self.qk_norm_per_head:
                g.rope_qk(q, k, il, L.attn_q_norm, L.attn_k_norm)
            else:
                q, k = g.rms_norm(q, L.attn_q_norm), g.rms_norm(k, L.attn_k_norm)
                g.rope(q, il, hp.n_head[il])
                g.rope(k, il, hp.n_head_kv[il])
            cur = g.attention(il, q, k, v, hp.kq_scale)                       # [n_tokens, n_embd]
            (cur,) = g.project(cur, L.attn_output)
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                # [n_outputs, n_embd]
            x = g.add(g.rms_norm(cur, L.post_attention_norm), x)
            # feed-forward, normed after
            gate, up = g.project(x, L.ffn_gate, L.ffn_up)                     # [n, n_ff]
            (cur,) = g.project(g.swiglu(gate, up), L.ffn_down)                # [n, n_embd]
            x = g.add(g.rms_norm(cur, L.post_ffw_norm), x)
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]
