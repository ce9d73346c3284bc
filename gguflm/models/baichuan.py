"""Baichuan: Llama's block (Q, K and V apart, an output projection of its own, no biases). As
llama.cpp decides by the layer count: 32 layers (Baichuan 7B) rotate Q and K by RoPE; 40 layers
(13B) attend with ALiBi biases (maximum 8) instead; any other count uses no positions at all.
llama.cpp's K-shift still rotates the cached K rows of every count (its RoPE type is Llama's),
and so does gguflm's."""

from __future__ import annotations

from gguflm.hparams import HParamReader, HParams
from gguflm.models.bloom import ALIBI_MAX_BIAS
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
            hp = hp.with_changes(f_max_alibi_bias=ALIBI_MAX_BIAS)
        if hp.n_layer != LAYERS_7B:
            hp = hp.with_changes(no_rope_layers=(True,) * hp.n_layer)
        return hp

    @classmethod
    def shifts_rope(cls, hp: HParams, il: int) -> bool:
        return True
