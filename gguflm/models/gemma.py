"""Gemma (1): embeddings scaled by sqrt(n_embd), queries by 1/sqrt(head_dim), GELU-gated FFN,
split-half RoPE, the token embedding as output projection; Gemma 2's block without its post-norms,
soft-capping and sliding window."""

from __future__ import annotations

from gguflm.hparams import HParamReader, HParams, rsqrt_f32, sqrt_f32
from gguflm.models.base import TensorSpec
from gguflm.models.gemma2 import Gemma2


class Gemma(Gemma2):
    name = "gemma"
    post_norms = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        return hp.with_changes(f_attention_scale=rsqrt_f32(hp.n_embd_head_k), f_embedding_scale=sqrt_f32(hp.n_embd))

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            specs.append(TensorSpec(f"blk.{il}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.attention_specs(hp, il)
            specs.append(TensorSpec(f"blk.{il}.ffn_norm.weight", (hp.n_embd,)))
            specs += cls.ffn_specs(hp, il)
        return specs
