"""Apertus: Llama's attention (RMSNorm, Q and K RMS-normed per head before RoPE in split halves,
GQA, optional biases) with a feed-forward of one up projection through xIELU (ggml_xielu: its
alpha_n, alpha_p, beta and eps from the file's ``xielu.*`` keys, one value or one per layer)
and down."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama

if TYPE_CHECKING:
    from gguflm.model import Layer

XIELU_KEYS = ("xielu.alpha_n", "xielu.alpha_p", "xielu.beta", "xielu.eps")   # no {arch} prefix, as llama.cpp's


def per_layer_floats(kv: HParamReader, key: str, n_layer: int) -> np.ndarray:
    """A required float that is one value for all layers or an array of one per layer."""
    value = kv.metadata.get(key)
    if value is None:
        raise HParamError(f"{kv.source}: missing key {key}")
    values = np.asarray(value, np.float32).reshape(-1)
    if values.size == 1:
        return np.repeat(values, n_layer)
    if values.size != n_layer:
        raise HParamError(f"{kv.source}: {key} has {values.size} values for {n_layer} layers")
    return values


class Apertus(Llama):
    name = "apertus"
    rope_type = RopeType.NEOX
    required_output = True
    attention_bias = None
    qk_norm = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        # per layer: its alpha_n, alpha_p, beta, eps
        xielu = np.stack([per_layer_floats(kv, key, hp.n_layer) for key in XIELU_KEYS], axis=1)
        return hp.with_changes(extras={**hp.extras, "xielu": tuple(tuple(float(v) for v in row) for row in xielu)})

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        specs.append(TensorSpec("rope_freqs.weight", (hp.n_rot // 2,), optional=True))
        for il in range(hp.n_layer):
            blk, e, d = f"blk.{il}", hp.n_embd, hp.n_embd_head_k
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (e,)))
            specs += cls.attention_specs(hp, il, bias=None)
            specs += [TensorSpec(f"{blk}.attn_q_norm.weight", (d,)), TensorSpec(f"{blk}.attn_k_norm.weight", (d,)),
                      TensorSpec(f"{blk}.ffn_norm.weight", (e,)),
                      TensorSpec(f"{blk}.ffn_down.weight", (hp.n_ff[il], e)),
                      TensorSpec(f"{blk}.ffn_up.weight", (e, hp.n_ff[il]))]
        return specs

    def ffn(self, g: Graph, cur: np.ndarray, L: Layer, il: int) -> np.ndarray:
        """up, xIELU with the layer's parameters, down."""
        (up,) = g.project(cur, L.ffn_up)                                       # [n, n_ff]
        g.xielu(up, np.array(g.hparams.extras["xielu"][il], np.float32))
        return g.project(up, L.ffn_down)[0]                                   # [n, n_embd]
