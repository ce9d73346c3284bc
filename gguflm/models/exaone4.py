"""EXAONE 4: OLMo 2's block (RMS norms after attention and the feed-forward only) with Q and K
RMS-normed per head; the 32B (64 layers) slides three of every four layers and gives the global
ones no RoPE."""

from __future__ import annotations

from gguflm.hparams import HParamReader, HParams, read_interleaved_swa
from gguflm.models.base import TensorSpec
from gguflm.models.olmo2 import Olmo2

# llama.cpp gives only the 64-layer model its interleaved sliding window (exaone4.cpp)
SWA_LAYER_COUNT = 64


class Exaone4(Olmo2):
    name = "exaone4"
    required_output = False
    qk_norm_per_head = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        if hp.n_layer != SWA_LAYER_COUNT:
            return hp
        return read_interleaved_swa(kv, hp, 4, n_swa=4096)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        specs.append(TensorSpec("rope_freqs.weight", (hp.n_rot // 2,), optional=True))
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += cls.attention_specs(hp, il)
            specs += [TensorSpec(f"{blk}.attn_q_norm.weight", (hp.n_embd_head_k,)),
                      TensorSpec(f"{blk}.attn_k_norm.weight", (hp.n_embd_head_k,)),
                      TensorSpec(f"{blk}.post_attention_norm.weight", (hp.n_embd,))]
            specs += cls.ffn_specs(hp, il)
            specs.append(TensorSpec(f"{blk}.post_ffw_norm.weight", (hp.n_embd,)))
        return specs
