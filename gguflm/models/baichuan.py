"""Baichuan: Llama's block (Q, K and V apart, an output projection of its own, no biases). As
llama.cpp decides by the layer count: 32 layers (Baichuan 7B) rotate Q and K by RoPE; 40 layers
(13B) attend with ALiBi instead, which gguflm's cached attention does not do (refused); any other
count uses no positions at all."""

from __future__ import annotations

from gguflm.errors import ModelLoadError
from gguflm.hparams import HParamReader, HParams
from gguflm.models.llama import Llama

LAYERS_7B, LAYERS_13B = 32, 40


class Baichuan(Llama):
    name = "baichuan"
    required_output = True
    attention_bias = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        if hp.n_layer == LAYERS_13B:
            raise ModelLoadError(f"{kv.source}: Baichuan 13B (40 layers) attends with ALiBi, which gguflm "
                                 f"does not support for cached attention yet")
        if hp.n_layer != LAYERS_7B:
            hp = hp.with_changes(no_rope_layers=(True,) * hp.n_layer)
        return hp
