"""Qwen 2 MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen 2's block with a mixture of SwiGLU experts
(softmax routing, weights not normalised) and a shared expert whose output a sigmoid gate scales."""

from __future__ import annotations

from gguflm.hparams import HParamReader, HParams, read_expert_hparams
from gguflm.models.base import TensorSpec
from gguflm.models.qwen2 import Qwen2


class Qwen2Moe(Qwen2):
    name = "qwen2moe"
    norm_expert_weights = False
    required_output = True
    attention_bias = None
    shared_expert_gate = True

    @classmethod
    def read_experts(cls, kv: HParamReader, hp: HParams) -> HParams:
        hp = read_expert_hparams(kv, hp, shared=True)
        return hp.with_changes(n_ff_shexp=hp.n_ff_shexp or hp.n_ff[0])

    @classmethod
    def has_experts(cls, hp: HParams, il: int) -> bool:
        return True

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.attention_specs(hp, il, bias=cls.attention_bias)
            specs.append(TensorSpec(f"{blk}.ffn_norm.weight", (hp.n_embd,)))
            specs += cls.expert_specs(hp, il)
            specs.append(TensorSpec(f"{blk}.ffn_gate_inp_shexp.weight", (hp.n_embd,)))
            specs += cls.shared_expert_specs(hp, il, hp.n_ff_shexp)
        return specs
