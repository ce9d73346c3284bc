"""ARWKV-7 (RWKV-7 time mixing distilled into a transformer's body): RMSNorms, RWKV-7's time mix
(its gate and group norm optional) on one token-shift row, then a SwiGLU feed-forward instead of
the channel mix, as llama.cpp's ``src/models/arwkv7.cpp``. The memory is recurrent, as RWKV-7's."""

from __future__ import annotations

from gguflm.hparams import HParams
from gguflm.models.base import TensorSpec
from gguflm.models.rwkv6 import FeedForwardBody
from gguflm.models.rwkv7 import Rwkv7


class Arwkv7(FeedForwardBody, Rwkv7):
    name = "arwkv7"
    optional_gate_and_norm = True

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            specs += cls.body_specs(hp, il) + cls.time_mix_specs(hp, il)
        return specs
