"""JAIS: GPT-2's block (LayerNorms with biases, a fused and biased QKV, a biased attention output)
with a biased SwiGLU feed-forward, no position embeddings, ALiBi biases where the file sets
``attention.max_alibi_bias``, an output projection of its own, and scores scaled by 1 / head_dim
(not its square root), as llama.cpp's graph scales them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamReader, HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.gpt2 import GPT2

if TYPE_CHECKING:
    from gguflm.model import Layer


class Jais(GPT2):
    name = "jais"
    rope_type = RopeType.NONE
    position_embeddings = False
    required_output = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        return hp.with_changes(f_max_alibi_bias=kv.get_float("{arch}.attention.max_alibi_bias", 0.0))

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = super().tensor_specs(hp)
        for il in range(hp.n_layer):   # the gate beside the up projection
            blk, f = f"blk.{il}", hp.n_ff[il]
            specs += [TensorSpec(f"{blk}.ffn_gate.weight", (hp.n_embd, f)), TensorSpec(f"{blk}.ffn_gate.bias", (f,))]
        return specs

    @staticmethod
    def kq_scale(hp: HParams) -> float:
        return float(np.float32(1.0) / np.float32(hp.n_embd_head_k))

    @staticmethod
    def ffn(g: Graph, x: np.ndarray, L: Layer) -> np.ndarray:
        """LayerNorm, then silu(gate + its bias) * (up + its bias), down + its bias."""
        cur = g.layer_norm(x, L.ffn_norm, L.ffn_norm_bias)
        up, gate = g.project(cur, L.ffn_up, L.ffn_gate)                       # [n, n_ff]
        g.add_bias(up, L.ffn_up_bias)
        g.add_bias(gate, L.ffn_gate_bias)
        return g.linear(g.swiglu(gate, up), L.ffn_down, L.ffn_down_bias)      # [n, n_embd]
