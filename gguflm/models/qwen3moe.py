"""Qwen 3 MoE: Qwen 3's block with a mixture of SwiGLU experts (softmax routing, the selected
weights normalised to sum 1) in every layer."""

from __future__ import annotations

from gguflm.hparams import HParamReader, HParams, read_expert_hparams
from gguflm.models.qwen3 import Qwen3


class Qwen3Moe(Qwen3):
    name = "qwen3moe"

    @classmethod
    def read_experts(cls, kv: HParamReader, hp: HParams) -> HParams:
        return read_expert_hparams(kv, hp)
