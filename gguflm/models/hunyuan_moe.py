"""Hunyuan MoE (hunyuan-moe: Hunyuan-A13B): Hunyuan's block (Q/K RMS norms after split-half RoPE)
with experts ``feed_forward_length`` wide in every layer, routed by softmax with the selected
weights normalised, beside one ungated shared feed-forward ``expert_shared_feed_forward_length``
wide (or ``feed_forward_length``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguflm.graph import GATING_SOFTMAX
from gguflm.hparams import HParamReader, HParams, read_expert_hparams
from gguflm.models.hunyuan_dense import HunyuanDense

if TYPE_CHECKING:
    from gguflm.model import Layer


class HunyuanMoe(HunyuanDense):
    name = "hunyuan-moe"

    @classmethod
    def read_experts(cls, kv: HParamReader, hp: HParams) -> HParams:
        kv.get_int("{arch}.expert_feed_forward_length")   # required, as llama.cpp reads it (its graph uses n_ff)
        hp = read_expert_hparams(kv, hp, n_ff_exp_key=False, shared=True)
        return hp.with_changes(n_ff_shexp=hp.n_ff_shexp or hp.n_ff[0])

    @classmethod
    def has_experts(cls, hp: HParams, il: int) -> bool:
        return True

    def routing(self, hp: HParams, L: Layer) -> dict:
        return {"gating": GATING_SOFTMAX, "norm_w": True}
