"""Qwen 3: Llama's block with per-head RMS norms on Q and K before RoPE, split-half RoPE."""

from __future__ import annotations

from gguflm.hparams import HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama


class Qwen3(Llama):
    name = "qwen3"
    rope_type = RopeType.NEOX
    attention_bias = False
    qk_norm = True

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.attention_specs(hp, il, bias=cls.attention_bias)
            specs += [
                TensorSpec(f"{blk}.attn_q_norm.weight", (hp.n_embd_head_k,)),
                TensorSpec(f"{blk}.attn_k_norm.weight", (hp.n_embd_head_k,)),
                TensorSpec(f"{blk}.ffn_norm.weight", (hp.n_embd,)),
            ]
            specs += cls.ffn_or_expert_specs(hp, il)
        return specs
