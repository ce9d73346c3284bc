"""DeepSeek-V2 / V3 (deepseek2): multi-head latent attention and DeepSeek's mixture of experts.

Attention: Q through a low-rank pair (``attn_q_a``, an RMS norm, ``attn_q_b``; one ``attn_q`` in
the Lite models, whose files give q_lora_rank 0 or have 26/27 layers), K and V compressed to one
latent row of ``kv_lora_rank`` values per token plus ``n_rot`` rotated values shared by all heads
(``attn_kv_a_mqa``), each head's rotated part last (adjacent-pair RoPE). It runs in llama.cpp's
absorbed form (:meth:`gguflm.graph.Graph.mla_attention`): the cache keeps the latent row and
the rotated part as K, V is the latent, and the per-head ``attn_k_b`` / ``attn_v_b`` fold into
the query and out of the attended latent; the attention scale is YaRN's mscale squared over the
square root of the decompressed head width, as llama.cpp's graph pre-scales it. Files from before
the split attn_k_b / attn_v_b (one ``attn_kv_b``, no ``key_length_mla``) run with full heads in the
cache (:meth:`gguflm.graph.Graph.mla_decompressed`), as llama.cpp runs them.

Feed-forward: dense SwiGLU in the first ``leading_dense_block_count`` layers, then routed experts
(softmax or sigmoid scores, the selection bias ``exp_probs_b``, group-limited where the file
groups them, normalised and scaled weights) beside ungated shared experts
(:class:`gguflm.models.llama.RoutedExperts`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gguflm.graph import GATING_SIGMOID, GATING_SOFTMAX, Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType, read_routed_expert_hparams
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama, RoutedExperts
from gguflm.rope import logf

if TYPE_CHECKING:
    from gguflm.model import Layer


def head_widths(hp: HParams) -> tuple[int, int]:
    """A query head's width and a value head's once decompressed (llama.cpp's n_embd_head_k_mla()
    and n_embd_head_v_mla(): the cache's head widths in a file without the absorbed form)."""
    return (hp.n_embd_head_k_mla, hp.n_embd_head_v_mla) if hp.is_mla else (hp.n_embd_head_k, hp.n_embd_head_v)


def is_lite(hp: HParams) -> bool:
    """llama.cpp's test for the Lite models (DeepSeek-V2-Lite, GigaChat3, Kanana-2), which read no
    q_lora_rank: their layer count."""
    return hp.n_layer in (26, 27) or (hp.n_layer == 48 and hp.n_vocab == 128256)


class Deepseek2(RoutedExperts, Llama):
    name = "deepseek2"
    rope_type = RopeType.NORM

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        kv.get_float("{arch}.attention.layer_norm_rms_epsilon")   # required
        n_lora_q = 0 if is_lite(hp) else kv.get_int("{arch}.attention.q_lora_rank")
        n_lora_kv = kv.positive("attention.kv_lora_rank", kv.get_int("{arch}.attention.kv_lora_rank"))
        k_mla = kv.get_int("{arch}.attention.key_length_mla", 0)
        v_mla = kv.get_int("{arch}.attention.value_length_mla", 0)
        if not (k_mla and v_mla):   # a file from before the split attn_k_b / attn_v_b: full heads
            if hp.n_rot >= hp.n_embd_head_k or hp.n_head_kv != hp.n_head:
                raise HParamError(f"{kv.source}: deepseek2 without key_length_mla needs head_count_kv = head_count "
                                  f"and rope.dimension_count below key_length, found {sorted(set(hp.n_head_kv))}, "
                                  f"{hp.n_rot} and {hp.n_embd_head_k}")
        elif k_mla <= hp.n_rot or hp.n_embd_head_k != n_lora_kv + hp.n_rot or hp.n_embd_head_v != n_lora_kv \
                or any(h != 1 for h in hp.n_head_kv):
            raise HParamError(f"{kv.source}: multi-head latent attention needs key_length = kv_lora_rank + "
                              f"rope.dimension_count, value_length = kv_lora_rank, head_count_kv = 1 and "
                              f"key_length_mla > rope.dimension_count; found {hp.n_embd_head_k}, {hp.n_embd_head_v}, "
                              f"{sorted(set(hp.n_head_kv))}, {k_mla} (kv_lora_rank {n_lora_kv}, rope {hp.n_rot})")
        if kv.get_float("{arch}.attention.temperature_scale", 0.0):
            raise HParamError(f"{kv.source}: attention temperature scaling (Mistral Large 3) is not supported")
        changes = {}
        if kv.key("{arch}.rope.scaling.yarn_log_multiplier") in kv.metadata:
            # llama.cpp undoes the converter's factor 0.1, and takes the result as YaRN's mscale too
            log_mul = float(np.float32(hp.rope_yarn_log_mul) / np.float32(0.1))
            changes = {"rope_yarn_log_mul": log_mul, "rope_yarn_mscale": log_mul if log_mul != 1.0 else 1.0}
        hp = hp.with_changes(n_lora_q=n_lora_q, n_lora_kv=n_lora_kv, n_embd_head_k_mla=k_mla if v_mla else 0,
                             n_embd_head_v_mla=v_mla if k_mla else 0, **changes)
        # GGUFs of DeepSeek V2 / V2.5 name no gating function: softmax, but sigmoid for GLM 4.7 Lite
        glm_lite = hp.n_layer in (47, 48) and n_vocab == 154880
        return read_routed_expert_hparams(kv, hp, gating=GATING_SIGMOID if glm_lite else GATING_SOFTMAX)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e, rank, n_rot = hp.n_embd, hp.n_lora_kv, hp.n_rot
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk, n_head = f"blk.{il}", hp.n_head[il]
            dk, dv = head_widths(hp)
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (e,)))
            if hp.n_lora_q:
                specs += [TensorSpec(f"{blk}.attn_q_a_norm.weight", (hp.n_lora_q,)),
                          TensorSpec(f"{blk}.attn_q_a.weight", (e, hp.n_lora_q)),
                          TensorSpec(f"{blk}.attn_q_b.weight", (hp.n_lora_q, n_head * dk))]
            else:
                specs.append(TensorSpec(f"{blk}.attn_q.weight", (e, n_head * dk)))
            specs += [TensorSpec(f"{blk}.attn_kv_a_norm.weight", (rank,)),
                      TensorSpec(f"{blk}.attn_kv_a_mqa.weight", (e, rank + n_rot))]
            if hp.is_mla:
                specs += [TensorSpec(f"{blk}.attn_k_b.weight", (dk - n_rot, rank, n_head)),
                          TensorSpec(f"{blk}.attn_v_b.weight", (rank, dv, n_head))]
            else:
                specs.append(TensorSpec(f"{blk}.attn_kv_b.weight", (rank, n_head * (dk - n_rot + dv))))
            specs += [TensorSpec(f"{blk}.attn_output.weight", (n_head * dv, e)),
                      TensorSpec(f"{blk}.ffn_norm.weight", (e,))]
            specs += cls.ffn_or_expert_specs(hp, il)
        return specs

    @staticmethod
    def kq_scale(g: Graph) -> float:
        """llama.cpp's pre-scaled attention scale: YaRN's mscale (from the context's attention
        factor with YaRN's own correction undone, and the log multiplier), squared, over
        sqrt(key_length_mla); float32 as llama.cpp computes it."""
        f32, hp, rc = np.float32, g.hparams, g.ctx.rope_config(0)
        log_inv_scale = logf(f32(1) / f32(rc.freq_scale))
        attn_factor_org = f32(rc.attn_factor) * (f32(1) + f32(0.1) * log_inv_scale)
        mscale = attn_factor_org * (f32(1) + f32(f32(0.1) * f32(hp.rope_yarn_log_mul)) * log_inv_scale)
        return float(f32(f32(1) * mscale * mscale) / np.sqrt(f32(head_widths(hp)[0])))

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        kq_scale = self.kq_scale(g)
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = g.rms_norm(x, L.attn_norm)
            q = self.query(g, cur, L)                                          # [n_tokens, n_head * key_length_mla]
            (kv,) = g.project(cur, L.attn_kv_a_mqa)                           # [n_tokens, kv_lora_rank + n_rot]
            if hp.is_mla:
                cur = g.mla_attention(il, q, kv, L, kq_scale)                 # [n_tokens, n_head * value_length_mla]
            else:   # full heads in the cache
                cur = g.attention(il, *g.mla_decompressed(il, q, kv, L), kq_scale)
            (cur,) = g.project(cur, L.attn_output)                            # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                # [n_outputs, n_embd]
            g.add(x, cur)
            cur = self.ffn(g, g.rms_norm(x, L.ffn_norm), L, il)               # [n, n_embd]
            g.add(x, cur)
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]

    @staticmethod
    def query(g: Graph, cur: np.ndarray, L: Layer) -> np.ndarray:
        """Q's heads: through the low-rank pair and its norm, or the Lite models' one matrix."""
        if not g.hparams.n_lora_q:
            return g.project(cur, L.attn_q)[0]
        (q,) = g.project(cur, L.attn_q_a)                                     # [n_tokens, q_lora_rank]
        return g.project(g.rms_norm(q, L.attn_q_a_norm), L.attn_q_b)[0]
