"""RWKV6Qwen2 (QRWKV-6, RWKV-6 time mixing distilled into Qwen 2.5): RMSNorms, RWKV-6's time mix
without time_mix_first, i.e. gated linear attention with a sigmoid gate, K and V with their own
(grouped) heads and biases, on one token-shift row; then a SwiGLU feed-forward, as llama.cpp's
``src/models/rwkv6qwen2.cpp``. The memory is recurrent, as RWKV-6's."""

from __future__ import annotations

from gguflm.hparams import HParams
from gguflm.models.base import TensorSpec
from gguflm.models.rwkv6 import FeedForwardBody, Rwkv6


class Rwkv6Qwen2(FeedForwardBody, Rwkv6):
    name = "rwkv6qwen2"
    qrwkv = True

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp) + [TensorSpec("output_norm.bias", (hp.n_embd,), optional=True)]
        for il in range(hp.n_layer):
            specs += cls.body_specs(hp, il) + cls.time_mix_specs(hp, il)
        return specs
