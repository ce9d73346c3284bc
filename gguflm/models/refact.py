"""Refact: Llama's block (RMSNorm, SwiGLU feed-forward) without RoPE: attention takes ALiBi biases
(maximum 8, as llama.cpp fixes it). Q, K and V come fused or apart (llama.cpp's
create_tensor_qkv), with their biases where the file has them; the attention output's and the
feed-forward's optional biases are read but never added, as llama.cpp's graph leaves them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamReader, HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.bert import Bert
from gguflm.models.bloom import ALIBI_MAX_BIAS
from gguflm.models.llama import Llama

if TYPE_CHECKING:
    from gguflm.model import Layer


class Refact(Llama):
    name = "refact"
    rope_type = RopeType.NONE
    attention_bias = None
    attention_output_bias = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        return cls.read_common(kv, n_vocab).with_changes(f_max_alibi_bias=ALIBI_MAX_BIAS)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        specs.append(TensorSpec("rope_freqs.weight", (hp.n_rot // 2,), optional=True))
        for il in range(hp.n_layer):
            blk, e, f = f"blk.{il}", hp.n_embd, hp.n_ff[il]
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (e,)))
            specs += Bert.qkv_specs(hp, il)
            specs += [TensorSpec(f"{blk}.attn_output.weight", (hp.n_embd_head_k * hp.n_head[il], e)),
                      TensorSpec(f"{blk}.attn_output.bias", (e,), optional=True),
                      TensorSpec(f"{blk}.ffn_norm.weight", (e,))]
            specs += cls.ffn_specs(hp, il)
            specs += [TensorSpec(f"{blk}.ffn_gate.bias", (f,), optional=True),
                      TensorSpec(f"{blk}.ffn_down.bias", (e,), optional=True),
                      TensorSpec(f"{blk}.ffn_up.bias", (f,), optional=True)]
        return specs

    def qkv(self, g: Graph, cur: np.ndarray, L: Layer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return Bert.qkv(g, L, L.index, cur)
