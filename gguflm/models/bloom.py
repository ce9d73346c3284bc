"""BLOOM: GPT-2's block (LayerNorms with biases, a fused and biased QKV, a biased GELU
feed-forward) without position embeddings: attention takes ALiBi biases (maximum 8, as llama.cpp
fixes it) instead, and the token embeddings pass a LayerNorm of their own first."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamReader, HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.gpt2 import GPT2

ALIBI_MAX_BIAS = 8.0   # llama.cpp's, for the families whose files do not say


class Bloom(GPT2):
    name = "bloom"
    rope_type = RopeType.NONE
    position_embeddings = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        return super().read_hparams(kv, n_vocab).with_changes(f_max_alibi_bias=ALIBI_MAX_BIAS)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = super().tensor_specs(hp)
        return specs[:1] + cls.norm_specs("token_embd_norm", hp.n_embd) + specs[1:]

    def inputs(self, g: Graph) -> np.ndarray:
        t = g.model.tensors
        return g.layer_norm(g.embed(t["token_embd.weight"]), t["token_embd_norm.weight"], t["token_embd_norm.bias"])
