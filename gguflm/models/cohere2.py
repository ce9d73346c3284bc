"""Cohere 2 (Command R7B, Command A): Command R's parallel block, with three of every four layers
sliding (RoPE) and the fourth global (no RoPE), and no per-head Q/K norms at any size."""

from __future__ import annotations

from gguflm.hparams import HParamReader, HParams, read_interleaved_swa
from gguflm.models.command_r import CommandR


class Cohere2(CommandR):
    name = "cohere2"

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        return read_interleaved_swa(kv, super().read_hparams(kv, n_vocab), 4)

    @staticmethod
    def qk_norm(hp: HParams) -> bool:
        return False
