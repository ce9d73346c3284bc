"""Qwen 2 / 2.5: Llama's block with biases on Q, K and V and split-half RoPE."""

from __future__ import annotations

from gguflm.hparams import HParamReader, HParams, RopeType, require_heads_span_embd
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama


class Qwen2(Llama):
    name = "qwen2"
    rope_type = RopeType.NEOX
    attention_bias = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        require_heads_span_embd(kv, hp)
        return hp

    @classmethod
    def has_experts(cls, hp: HParams, il: int) -> bool:
        return False

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            specs.append(TensorSpec(f"blk.{il}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.attention_specs(hp, il, bias=cls.attention_bias)
            specs.append(TensorSpec(f"blk.{il}.ffn_norm.weight", (hp.n_embd,)))
            specs += cls.ffn_specs(hp, il)
        return specs
