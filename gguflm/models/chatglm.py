"""ChatGLM (ChatGLM-3, GLM-4 in the old format): RMSNorm, Q, K and V fused (or apart, each with
its bias where the file has one: llama.cpp's create_tensor_qkv), RoPE in adjacent pairs over the
first rope.dimension_count values of each head, GQA, no attention output bias, and a SwiGLU
feed-forward over the two halves of one up projection (gate first)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamReader, HParams
from gguflm.models.base import TensorSpec
from gguflm.models.bert import Bert
from gguflm.models.llama import Llama

if TYPE_CHECKING:
    from gguflm.model import Layer


class ChatGLM(Llama):
    name = "chatglm"
    heads_span_embd = True
    attention_bias = None
    attention_output_bias = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        return cls.read_common(kv, n_vocab)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk, e, f = f"blk.{il}", hp.n_embd, hp.n_ff[il]
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (e,)))
            specs += Bert.qkv_specs(hp, il)
            specs += [TensorSpec(f"{blk}.attn_output.weight", (e, e)),
                      TensorSpec(f"{blk}.ffn_norm.weight", (e,)),
                      TensorSpec(f"{blk}.ffn_up.weight", (e, 2 * f)),
                      TensorSpec(f"{blk}.ffn_down.weight", (f, e))]
        return specs

    def qkv(self, g: Graph, cur: np.ndarray, L: Layer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return Bert.qkv(g, L, L.index, cur)

    def ffn(self, g: Graph, cur: np.ndarray, L: Layer, il: int) -> np.ndarray:
        """SwiGLU over the halves of the fused up projection (ggml_swiglu: gate first), down."""
        (gate_up,) = g.project(cur, L.ffn_up)                                 # [n, 2 * n_ff]
        gate, up = g.split(gate_up, g.hparams.n_ff[il], g.hparams.n_ff[il])
        return g.project(g.swiglu(gate, up), L.ffn_down)[0]                   # [n, n_embd]
