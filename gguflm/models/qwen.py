"""Qwen (the first generation): Llama's block with a fused, biased QKV projection, split-half
RoPE, an output projection of its own, and a feed-forward half as wide as the file's
``feed_forward_length``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamReader, HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama

if TYPE_CHECKING:
    from gguflm.model import Layer


class Qwen(Llama):
    name = "qwen"
    rope_type = RopeType.NEOX
    required_output = True
    heads_span_embd = True
    attention_bias = False   # the fused projection's bias is added in qkv()

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        return hp.with_changes(n_ff=tuple(f // 2 for f in hp.n_ff))

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk, e = f"blk.{il}", hp.n_embd
            specs += [TensorSpec(f"{blk}.attn_norm.weight", (e,)),
                      TensorSpec(f"{blk}.attn_qkv.weight", (e, 3 * e)), TensorSpec(f"{blk}.attn_qkv.bias", (3 * e,)),
                      TensorSpec(f"{blk}.attn_output.weight", (e, e)), TensorSpec(f"{blk}.ffn_norm.weight", (e,))]
            specs += cls.ffn_specs(hp, il)
        return specs

    def qkv(self, g: Graph, cur: np.ndarray, L: Layer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        qkv = g.linear(cur, L.attn_qkv, L.attn_qkv_bias)                     # [n_tokens, 3 * n_embd]
        return g.split(qkv, g.hparams.n_embd, g.hparams.n_embd, g.hparams.n_embd)
