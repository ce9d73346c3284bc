"""Jamba: Mamba-1 layers (``head_count_kv`` 0; dt, B and C RMS-normed with weights)
interleaved with attention layers without RoPE, each followed by a SwiGLU feed-forward, dense or
a mixture of experts (softmax routing, weights not renormalised) where the file has the layer's
router (llama.cpp's ``src/models/jamba.cpp``). The memory is hybrid: the attention layers in the
KV cache, the Mamba layers' states in the recurrent memory."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType, read_expert_hparams, rsqrt_f32
from gguflm.models.base import TensorSpec
from gguflm.models.hybrid import read_hybrid_hparams, require_attention
from gguflm.models.llama import Llama
from gguflm.models.mamba import Mamba


class Jamba(Llama):
    name = "jamba"
    rope_type = RopeType.NONE
    memory = "hybrid"
    norm_expert_weights = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = read_hybrid_hparams(kv, n_vocab, cls.rope_type, mamba2=False)
        Mamba.require_expansion_2(kv, hp)
        attention = cls.attention_layers(hp)
        require_attention(kv, hp, attention)
        for il in attention:   # llama.cpp declares Q and the output n_embd x n_embd
            if hp.n_head[il] * hp.n_embd_head_k != hp.n_embd:
                raise HParamError(f"{kv.source}: layer {il}: {hp.n_head[il]} heads of {hp.n_embd_head_k} do not "
                                  f"make embedding_length {hp.n_embd}")
        if any(n <= 0 for n in hp.n_ff):
            raise HParamError(f"{kv.source}: every Jamba layer has a feed-forward, found feed_forward_length "
                              f"{list(hp.n_ff)}")
        return read_expert_hparams(kv, hp, required=False, n_ff_exp_key=False)

    state_sizes = Mamba.state_sizes

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            if hp.is_recurrent(il):
                specs += Mamba.ssm_specs(hp, il, bc_norms=True)
            else:
                specs += cls.qkv_specs(hp, il)
                specs.append(TensorSpec(f"{blk}.attn_output.weight", (hp.n_head[il] * hp.n_embd_head_v, hp.n_embd)))
            specs.append(TensorSpec(f"{blk}.ffn_norm.weight", (hp.n_embd,)))
            # experts where the file has the layer's router, else the dense feed-forward
            specs += [TensorSpec(s.name, s.shape, optional=True) for s in cls.ffn_or_expert_specs(hp, il)]
            if hp.n_expert:
                specs += [TensorSpec(s.name, s.shape, optional=True) for s in cls.ffn_specs(hp, il)]
        return specs

    @classmethod
    def required_together(cls, hp: HParams, present: set[str]) -> list[str]:
        required = []
        for il in range(hp.n_layer):
            moe = f"blk.{il}.ffn_gate_inp.weight" in present
            required += [s.name for s in (cls.expert_specs(hp, il) if moe else cls.ffn_specs(hp, il))]
        return required

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        g.recurrent_moves()
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = g.rms_norm(x, L.attn_norm)
            if hp.is_recurrent(il):
                cur = Mamba.mixer(g, il, L, cur)                             # [n_tokens, n_embd]
            else:
                q, k, v = self.qkv(g, cur, L)                                # no RoPE
                cur = g.attention(il, q, k, v, rsqrt_f32(hp.n_embd_head_v))  # [n_tokens, n_head * head_dim]
                (cur,) = g.project(cur, L.attn_output)                       # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                cur, x = g.output_rows(cur, x)                               # [n_outputs, n_embd]
            g.add(x, cur)
            cur = g.rms_norm(x, L.ffn_norm)
            if L.ffn_gate_inp is not None:
                cur = self.experts(g, cur, L)                                # [n, n_embd]
            else:
                gate, up = g.project(cur, L.ffn_gate, L.ffn_up)              # [n, n_ff]
                (cur,) = g.project(g.swiglu(gate, up), L.ffn_down)           # [n, n_embd]
            g.add(x, cur)
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                   # [n_outputs, n_vocab]
