"""gpt-oss (OpenAI's open-weight MoE): RMSNorm, split-half RoPE, attention with biases and a
learned sink logit per head, every other layer on a sliding window, then a mixture of experts
whose router and experts have biases, routed by a softmax over the selected experts' logits
(llama.cpp's SOFTMAX_WEIGHT gating) through a clamped SwiGLU (alpha 1.702, limit 7)."""

from __future__ import annotations

import numpy as np

from gguflm.graph import GATING_SOFTMAX_WEIGHT, Graph
from gguflm.hparams import HParamReader, HParams, RopeType, read_expert_hparams, read_swa_layers, rsqrt_f32
from gguflm.models.base import Architecture, TensorSpec

SWIGLU_LIMIT = 7.0   # llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants (alpha is the graph's)


class GptOss(Architecture):
    name = "gpt-oss"
    rope_type = RopeType.NEOX
    required_output = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = read_expert_hparams(kv, super().read_hparams(kv, n_vocab))
        kv.get_int("{arch}.expert_feed_forward_length")   # required, as llama.cpp reads it
        swa = read_swa_layers(kv, hp.n_layer, 2)
        return hp.with_changes(
            n_swa=kv.positive("attention.sliding_window", kv.get_int("{arch}.attention.sliding_window")),
            swa_layers=swa,
            rope_freq_base_train_swa=kv.get_float("{arch}.rope.freq_base_swa", hp.rope_freq_base_train),
            rope_freq_scale_train_swa=hp.rope_freq_scale_train,
            f_attention_scale=rsqrt_f32(hp.n_rot),
        )

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        e, f, n = hp.n_embd, hp.n_ff_exp, hp.n_expert
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += [TensorSpec(f"{blk}.attn_norm.weight", (e,)),
                      TensorSpec(f"{blk}.post_attention_norm.weight", (e,))]
            specs += cls.attention_specs(hp, il, bias=None)
            specs += [TensorSpec(f"{blk}.attn_sinks.weight", (hp.n_head[il],))]
            specs += cls.expert_specs(hp, il)
            specs += [TensorSpec(f"{blk}.attn_output.bias", (e,)),   # required here
                      TensorSpec(f"{blk}.ffn_gate_inp.bias", (n,)),
                      TensorSpec(f"{blk}.ffn_gate_exps.bias", (f, n)),
                      TensorSpec(f"{blk}.ffn_down_exps.bias", (e, n)),
                      TensorSpec(f"{blk}.ffn_up_exps.bias", (f, n))]
        # attention_specs declared the output bias optional: the later, required spec replaces it
        by_name = {s.name: s for s in specs}
        return list(by_name.values())

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            # self-attention with sinks
            cur = g.rms_norm(x, L.attn_norm)
            q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)            # [n_tokens, n_head(_kv) * head_dim]
            for t, bias in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
                g.add_bias(t, bias)
            g.rope(q, il, hp.n_head[il])
            g.rope(k, il, hp.n_head_kv[il])
            cur = g.attention(il, q, k, v, hp.kq_scale, sinks=L.attn_sinks)  # [n_tokens, n_head * head_dim]
            cur = g.linear(cur, L.attn_output, L.attn_output_bias)            # [n_tokens, n_embd]
            g.add(x, cur)
            # experts (every token: llama.cpp keeps only the output rows after the last layer)
            cur = g.rms_norm(x, L.post_attention_norm)
            cur = g.moe_ffn(cur, L, norm_w=False, gating=GATING_SOFTMAX_WEIGHT, swiglu_limit=SWIGLU_LIMIT,
                            biases=True)
            g.add(x, cur)
        (x,) = g.output_rows(x)                                               # [n_outputs, n_embd]
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]
