"""SmallThinker: Llama's attention (split-half RoPE, optional Q/K/V biases) and a mixture of ReGLU
experts in every layer whose router reads the block's input, before the attention norm
(build_moe_ffn's probs_in); the file's gating function, the selected weights normalised. Files
that name a sliding window get llama.cpp's fixed 4096-token window on every layer but the first
of each four, which also skip RoPE."""

from __future__ import annotations

import numpy as np

from gguflm.graph import GLU_REGLU, Graph
from gguflm.hparams import (EXPERT_GATING, HParamError, HParamReader, HParams, RopeType, read_expert_hparams,
                            read_swa_layers)
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama

N_SWA = 4096          # llama.cpp's loader sets it whatever the file says
NO_ROPE_STEP = 4      # llama_hparams' default n_no_rope_layer_step


class SmallThinker(Llama):
    name = "smallthinker"
    rope_type = RopeType.NEOX

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        kv.get_float("{arch}.attention.layer_norm_rms_epsilon")   # required
        if not hp.n_embd_head_k == hp.n_embd_head_v == hp.n_rot:
            raise HParamError(f"{kv.source}: smallthinker needs key_length = value_length = rope.dimension_count, "
                              f"found {hp.n_embd_head_k}, {hp.n_embd_head_v}, {hp.n_rot}")
        if kv.get_int("{arch}.attention.sliding_window", 0) > 0:
            swa = read_swa_layers(kv, hp.n_layer, 4, dense_first=True)
            hp = hp.with_changes(n_swa=N_SWA, swa_layers=swa,
                                 no_rope_layers=tuple(il % NO_ROPE_STEP == 0 for il in range(hp.n_layer)),
                                 rope_freq_base_train_swa=kv.get_float("{arch}.rope.freq_base_swa",
                                                                       hp.rope_freq_base_train),
                                 rope_freq_scale_train_swa=hp.rope_freq_scale_train)
        kv.positive("expert feed-forward length", kv.get_int("{arch}.expert_feed_forward_length"))
        hp = read_expert_hparams(kv, hp)
        gating = kv.get_int("{arch}.expert_gating_func", 0)
        if gating not in EXPERT_GATING:
            raise HParamError(f"{kv.source}: {kv.key('{arch}.expert_gating_func')} must be one of "
                              f"{sorted(EXPERT_GATING)} ({', '.join(EXPERT_GATING.values())}), found {gating}")
        return hp.with_changes(expert_gating_func=gating)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.qkv_specs(hp, il)
            specs += [TensorSpec(f"{blk}.attn_output.weight", (hp.n_embd_head_k * hp.n_head[il], hp.n_embd)),
                      TensorSpec(f"{blk}.ffn_norm.weight", (hp.n_embd,))]
            specs += cls.expert_specs(hp, il)
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            (logits,) = g.project(x, L.ffn_gate_inp)                          # [n_tokens, n_expert], on the input
            cur = g.rms_norm(x, L.attn_norm)
            q, k, v = self.qkv(g, cur, L)
            g.rope_qk(q, k, il)
            cur = g.attention(il, q, k, v, hp.kq_scale)                       # [n_tokens, n_head * head_dim]
            (cur,) = g.project(cur, L.attn_output)                            # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                x, cur, logits = g.output_rows(x, cur, logits)                # [n_outputs, ...]
            g.add(x, cur)
            cur = g.moe_ffn(g.rms_norm(x, L.ffn_norm), L, norm_w=True, gating=hp.expert_gating_func,
                            logits=logits, act=GLU_REGLU)
            g.add(x, cur)
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]
