"""SmolLM 3: Llama's block, but every fourth layer attends without RoPE (llama.cpp's
n_no_rope_layer_step)."""

from __future__ import annotations

from gguflm.hparams import HParamReader, HParams
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama

NO_ROPE_LAYER_STEP = 4


class SmolLM3(Llama):
    name = "smollm3"

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        return hp.with_changes(no_rope_layers=tuple((il + 1) % NO_ROPE_LAYER_STEP == 0 for il in range(hp.n_layer)))

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        return [s for s in super().tensor_specs(hp) if s.name != "rope_freqs.weight"]
