"""Seed-OSS: Llama's block with split-half RoPE and optional Q/K/V biases; the norm before the
feed-forward is stored as ``post_attention_norm``."""

from __future__ import annotations

from gguflm.hparams import HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama


class SeedOss(Llama):
    name = "seed_oss"
    rope_type = RopeType.NEOX

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.attention_specs(hp, il, bias=None)
            specs.append(TensorSpec(f"{blk}.post_attention_norm.weight", (hp.n_embd,), field="ffn_norm"))
            specs += cls.ffn_specs(hp, il)
        return specs
