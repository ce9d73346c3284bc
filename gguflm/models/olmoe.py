"""OLMoE: Llama's block with RMS norms over the whole Q and K rows before split-half RoPE, and
a mixture of SwiGLU experts (softmax routing, weights not normalised) in every layer."""

from __future__ import annotations

from gguflm.hparams import HParamError, HParamReader, HParams, RopeType, read_expert_hparams, require_heads_span_embd
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama


class Olmoe(Llama):
    name = "olmoe"
    rope_type = RopeType.NEOX
    norm_expert_weights = False
    required_output = True
    qk_norm = True   # full width (n_embd)

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        require_heads_span_embd(kv, hp)
        # llama.cpp declares the K norm n_embd wide: it can only norm K rows of that width
        if any(hp.n_head_kv[il] != hp.n_head[il] for il in range(hp.n_layer)):
            raise HParamError(f"{kv.source}: olmoe needs head_count_kv = head_count (its K norm spans "
                              f"embedding_length), found {list(hp.n_head_kv)} for {list(hp.n_head)}")
        return hp

    @classmethod
    def read_experts(cls, kv: HParamReader, hp: HParams) -> HParams:
        return read_expert_hparams(kv, hp, n_ff_exp_key=False)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.attention_specs(hp, il, bias=cls.attention_bias)
            specs += [TensorSpec(f"{blk}.attn_q_norm.weight", (hp.n_embd,)),
                      TensorSpec(f"{blk}.attn_k_norm.weight", (hp.n_embd,)),
                      TensorSpec(f"{blk}.ffn_norm.weight", (hp.n_embd,))]
            specs += cls.expert_specs(hp, il)
        return specs
