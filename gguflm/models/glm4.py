"""GLM-4 (the dense GLM-4-0414): RMS norms before and after both attention and the feed-forward,
Q/K/V biases where the file has them, partial RoPE on adjacent pairs, and a fused gate-and-up
projection whose halves feed SwiGLU."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams
from gguflm.models.base import Architecture, TensorSpec


class Glm4(Architecture):
    name = "glm4"

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        # multimodal RoPE sections (GLM-4.1V) and next-token-prediction layers are not run here
        if np.any(np.asarray(kv.metadata.get(kv.key("{arch}.rope.dimension_sections"), ()))):
            raise HParamError(f"{kv.source}: glm4 with rope.dimension_sections (M-RoPE) is not supported")
        if kv.get_int("{arch}.nextn_predict_layers", 0):
            raise HParamError(f"{kv.source}: glm4 with nextn_predict_layers is not supported")
        return hp

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk, e, ff = f"blk.{il}", hp.n_embd, hp.n_ff[il]
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (e,)))
            specs += cls.qkv_specs(hp, il)
            specs += [
                TensorSpec(f"{blk}.attn_output.weight", (hp.n_embd_head_v * hp.n_head[il], e)),
                TensorSpec(f"{blk}.post_attention_norm.weight", (e,)),
                TensorSpec(f"{blk}.ffn_norm.weight", (e,)),
                TensorSpec(f"{blk}.ffn_up.weight", (e, 2 * ff)),
                TensorSpec(f"{blk}.ffn_down.weight", (ff, e)),
                TensorSpec(f"{blk}.post_ffw_norm.weight", (e,)),
            ]
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            # self-attention, normed before and after
            cur = g.rms_norm(x, L.attn_norm)
            q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)            # [n_tokens, n_head(_kv) * head_dim]
            for t, bias in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
                g.add_bias(t, bias)
            g.rope_qk(q, k, il)
            cur = g.attention(il, q, k, v, hp.kq_scale)                       # [n_tokens, n_head * head_dim]
            (cur,) = g.project(cur, L.attn_output)                            # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                # [n_outputs, n_embd]
            x = g.add(g.rms_norm(cur, L.post_attention_norm), x)
            # feed-forward: SwiGLU over the fused projection's halves, normed before and after
            cur = g.rms_norm(x, L.ffn_norm)
            (gate_up,) = g.project(cur, L.ffn_up)                             # [n, 2 * n_ff]
            gate, up = g.split(gate_up, hp.n_ff[il], hp.n_ff[il])
            (cur,) = g.project(g.swiglu(gate, up), L.ffn_down)                # [n, n_embd]
            x = g.add(g.rms_norm(cur, L.post_ffw_norm), x)
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]
