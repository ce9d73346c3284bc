"""PhiMoE (Phi-3.5-MoE): Phi 3's graph with biases on every RMS norm, on Q/K/V where the file has
them, on the attention output and on the logits, and a mixture of SwiGLU experts
``feed_forward_length`` wide in every layer (softmax routing, the selected weights normalised)
in place of the fused feed-forward."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gguflm.graph import GATING_SOFTMAX, Graph
from gguflm.hparams import HParamReader, HParams, read_expert_hparams
from gguflm.models.base import TensorSpec
from gguflm.models.phi3 import Phi3

if TYPE_CHECKING:
    from gguflm.model import Layer


class PhiMoe(Phi3):
    name = "phimoe"
    required_output = True
    biased = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        kv.get_float("{arch}.attention.layer_norm_rms_epsilon")   # required
        return read_expert_hparams(kv, hp, n_ff_exp_key=False)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e = hp.n_embd
        specs = cls.output_specs(hp) + [TensorSpec("output_norm.bias", (e,)), TensorSpec("output.bias", (hp.n_vocab,))]
        specs += [TensorSpec("rope_factors_long.weight", (hp.n_rot // 2,), optional=True),
                  TensorSpec("rope_factors_short.weight", (hp.n_rot // 2,), optional=True)]
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += cls.norm_specs(f"{blk}.attn_norm", e)
            specs.append(TensorSpec(f"{blk}.attn_qkv.weight", (e, e + 2 * hp.n_embd_k_gqa(il)), optional=True))
            specs += cls.qkv_specs(hp, il, optional=True)
            specs += [TensorSpec(f"{blk}.attn_output.weight", (e, e)), TensorSpec(f"{blk}.attn_output.bias", (e,))]
            specs += cls.norm_specs(f"{blk}.ffn_norm", e)
            specs += cls.expert_specs(hp, il)
        return specs

    def ffn(self, g: Graph, cur: np.ndarray, L: Layer, il: int) -> np.ndarray:
        return g.moe_ffn(cur, L, norm_w=True, gating=GATING_SOFTMAX)
