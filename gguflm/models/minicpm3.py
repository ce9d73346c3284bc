"""MiniCPM3: latent attention with full heads (Q through a low-rank pair and its norm; K and V
expanded per head from one normed latent by ``attn_kv_b``, each head's K ending with a rotated
part all heads share; split-half RoPE over those last values, with Phi 3's long/short frequency
factors), a SwiGLU feed-forward, and MiniCPM's fixed scales as llama.cpp's graph has them: the
embeddings times 12, each branch times 1.4 / sqrt(n_layer) before its residual add, the final
hidden state times 256 / n_embd before the output projection."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama

SCALE_EMBD, SCALE_DEPTH, N_EMBD_BASE = 12.0, 1.4, 256   # llama.cpp's graph fixes them


class MiniCPM3(Llama):
    name = "minicpm3"
    rope_type = RopeType.NEOX

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        kv.get_float("{arch}.attention.layer_norm_rms_epsilon")   # required
        n_lora_q = kv.positive("attention.q_lora_rank", kv.get_int("{arch}.attention.q_lora_rank"))
        n_lora_kv = kv.positive("attention.kv_lora_rank", kv.get_int("{arch}.attention.kv_lora_rank"))
        if any(h != hp.n_head[0] for h in hp.n_head + hp.n_head_kv) or hp.n_rot >= hp.n_embd_head_k:
            raise HParamError(f"{kv.source}: minicpm3 needs one head count for Q and K and rope.dimension_count "
                              f"below key_length, found {sorted(set(hp.n_head))}, {sorted(set(hp.n_head_kv))}, "
                              f"{hp.n_rot} and {hp.n_embd_head_k}")
        return hp.with_changes(n_lora_q=n_lora_q, n_lora_kv=n_lora_kv)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e, rank, n_rot = hp.n_embd, hp.n_lora_kv, hp.n_rot
        specs = cls.output_specs(hp)
        specs += [TensorSpec("rope_factors_long.weight", (n_rot // 2,), optional=True),
                  TensorSpec("rope_factors_short.weight", (n_rot // 2,), optional=True)]
        for il in range(hp.n_layer):
            blk, n_head = f"blk.{il}", hp.n_head[il]
            specs += [TensorSpec(f"{blk}.attn_norm.weight", (e,)),
                      TensorSpec(f"{blk}.attn_q_a_norm.weight", (hp.n_lora_q,)),
                      TensorSpec(f"{blk}.attn_kv_a_norm.weight", (rank,)),
                      TensorSpec(f"{blk}.attn_q_a.weight", (e, hp.n_lora_q)),
                      TensorSpec(f"{blk}.attn_q_b.weight", (hp.n_lora_q, n_head * hp.n_embd_head_k)),
                      TensorSpec(f"{blk}.attn_kv_a_mqa.weight", (e, rank + n_rot)),
                      TensorSpec(f"{blk}.attn_kv_b.weight",
                                 (rank, n_head * (hp.n_embd_head_k - n_rot + hp.n_embd_head_v))),
                      TensorSpec(f"{blk}.attn_output.weight", (n_head * hp.n_embd_head_v, e)),
                      TensorSpec(f"{blk}.ffn_norm.weight", (e,))]
            specs += cls.ffn_specs(hp, il)
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        f32 = np.float32
        scale_res = float(f32(SCALE_DEPTH) / np.sqrt(f32(hp.n_layer)))
        x = g.embed(m.tensors["token_embd.weight"], scale=SCALE_EMBD)        # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = g.rms_norm(x, L.attn_norm)
            (q,) = g.project(cur, L.attn_q_a)                                 # [n_tokens, q_lora_rank]
            (q,) = g.project(g.rms_norm(q, L.attn_q_a_norm), L.attn_q_b)      # [n_tokens, n_head * key_length]
            (kv,) = g.project(cur, L.attn_kv_a_mqa)                           # [n_tokens, kv_lora_rank + n_rot]
            q, k, v = g.mla_decompressed(il, q, kv, L)
            cur = g.attention(il, q, k, v, hp.kq_scale)                       # [n_tokens, n_head * value_length]
            (cur,) = g.project(cur, L.attn_output)                            # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                # [n_outputs, n_embd]
            g.add(x, g.scale(cur, scale_res))
            cur = self.ffn(g, g.rms_norm(x, L.ffn_norm), L, il)               # [n, n_embd]
            g.add(x, g.scale(cur, scale_res))
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        (head,) = g.split(x, hp.n_embd)                                       # the embeddings stay unscaled
        g.scale(head, float(f32(N_EMBD_BASE) / f32(hp.n_embd)))
        return x, g.logits(head, m.tensors["output.weight"])                  # [n_outputs, n_vocab]
