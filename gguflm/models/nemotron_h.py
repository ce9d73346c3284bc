"""Nemotron-H: three kinds of layers, each an RMSNorm and one block on the
residual stream (llama.cpp's ``src/models/nemotron-h.cpp``): Mamba-2 (``head_count_kv`` 0 and
``feed_forward_length`` 0), attention without RoPE (``feed_forward_length`` 0), or an ungated
feed-forward with relu² (``feed_forward_length`` > 0). The control vector joins the feed-forward
layers' output before the residual add, as llama.cpp's graph adds it. The memory is hybrid: the
attention layers in the KV cache, the Mamba-2 layers' states in the recurrent memory."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType
from gguflm.models.base import Architecture, TensorSpec
from gguflm.models.hybrid import read_hybrid_hparams, require_attention
from gguflm.models.mamba2 import Mamba2


class NemotronH(Architecture):
    name = "nemotron_h"
    rope_type = RopeType.NONE
    memory = "hybrid"
    control_vector = False   # added by the forward pass, to the feed-forward layers' branch

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = read_hybrid_hparams(kv, n_vocab, cls.rope_type)
        if kv.get_int("{arch}.expert_count", 0):
            raise HParamError(f"{kv.source}: Nemotron-H's mixture-of-experts layers are not supported")
        # a layer is recurrent iff it has neither KV heads nor a feed-forward
        recurrent = tuple(n_kv == 0 and n_ff == 0 for n_kv, n_ff in zip(hp.n_head_kv, hp.n_ff))
        hp = hp.with_changes(recurrent_layers=recurrent)
        require_attention(kv, hp, cls.attention_layers(hp))
        eps = kv.get_float("{arch}.attention.layer_norm_epsilon")
        return hp.with_changes(f_norm_eps=eps, f_norm_rms_eps=kv.get_float("{arch}.attention.layer_norm_rms_epsilon", eps))

    @classmethod
    def attention_layers(cls, hp: HParams) -> list[int]:
        return [il for il in range(hp.n_layer) if not hp.is_recurrent(il) and hp.n_ff[il] == 0]

    state_sizes = Mamba2.state_sizes

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            if hp.is_recurrent(il):
                specs += Mamba2.ssm_specs(hp, il)
            elif hp.n_ff[il] == 0:
                specs += cls.attention_specs(hp, il, bias=None)
            else:
                specs += [TensorSpec(f"{blk}.ffn_up.weight", (hp.n_embd, hp.n_ff[il])),
                          TensorSpec(f"{blk}.ffn_up.bias", (hp.n_ff[il],), optional=True),
                          TensorSpec(f"{blk}.ffn_down.weight", (hp.n_ff[il], hp.n_embd)),
                          TensorSpec(f"{blk}.ffn_down.bias", (hp.n_embd,), optional=True)]
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        g.recurrent_moves()
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = g.rms_norm(x, L.attn_norm)
            if hp.is_recurrent(il):
                cur = Mamba2.mixer(g, il, L, cur)                            # [n_tokens, n_embd]
            elif hp.n_ff[il] == 0:
                q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)       # no RoPE
                for t, bias in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
                    g.add_bias(t, bias)
                cur = g.attention(il, q, k, v, hp.kq_scale)                  # [n_tokens, n_head * head_dim]
                cur = g.linear(cur, L.attn_output, L.attn_output_bias)       # [n_tokens, n_embd]
            else:
                up = g.linear(cur, L.ffn_up, L.ffn_up_bias)                  # [n_tokens, n_ff]
                cur = g.linear(g.relu_sqr(up), L.ffn_down, L.ffn_down_bias)  # [n_tokens, n_embd]
                g.control_vector_branch(cur, il)
            if il == hp.n_layer - 1:
                cur, x = g.output_rows(cur, x)                               # [n_outputs, n_embd]
            g.add(cur, x)
            x = cur
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                   # [n_outputs, n_vocab]
