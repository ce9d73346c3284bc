"""MPT: GPT-2's block with every bias optional (MPT-7B has none), position embeddings only where
the file has them, ALiBi biases where it sets ``attention.max_alibi_bias``, and the fused QKV
clamped to [-clamp_kqv, clamp_kqv] where it sets ``attention.clamp_kqv``.

Not run (the loader names the tensors as unused): Q/K LayerNorms (``attn_q_norm``,
``attn_k_norm``), which llama.cpp declares but whose graph aborts on them (it reshapes a strided
view of the fused QKV), and AWQ files' activation scales (``ffn_act``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamReader, HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.gpt2 import GPT2

if TYPE_CHECKING:
    from gguflm.model import Layer


class MPT(GPT2):
    name = "mpt"
    rope_type = RopeType.NONE

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        return hp.with_changes(f_max_alibi_bias=kv.get_float("{arch}.attention.max_alibi_bias", 0.0),
                               f_clamp_kqv=kv.get_float("{arch}.attention.clamp_kqv", 0.0))

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e = hp.n_embd
        specs = cls.output_specs(hp)
        specs.insert(2, TensorSpec("output_norm.bias", (e,), optional=True))
        specs.append(TensorSpec("position_embd.weight", (e, hp.n_ctx_train), optional=True))
        for il in range(hp.n_layer):
            blk, f, n_qkv = f"blk.{il}", hp.n_ff[il], e + hp.n_embd_k_gqa(il) + hp.n_embd_v_gqa(il)
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (e,)))
            specs.append(TensorSpec(f"{blk}.attn_norm.bias", (e,), optional=True))
            specs += [TensorSpec(f"{blk}.attn_qkv.weight", (e, n_qkv)),
                      TensorSpec(f"{blk}.attn_qkv.bias", (n_qkv,), optional=True),
                      TensorSpec(f"{blk}.attn_output.weight", (e, e)),
                      TensorSpec(f"{blk}.attn_output.bias", (e,), optional=True)]
            specs.append(TensorSpec(f"{blk}.ffn_norm.weight", (e,)))
            specs.append(TensorSpec(f"{blk}.ffn_norm.bias", (e,), optional=True))
            specs += [TensorSpec(f"{blk}.ffn_down.weight", (f, e)),
                      TensorSpec(f"{blk}.ffn_down.bias", (e,), optional=True),
                      TensorSpec(f"{blk}.ffn_up.weight", (e, f)),
                      TensorSpec(f"{blk}.ffn_up.bias", (f,), optional=True)]
        return specs

    @staticmethod
    def qkv(g: Graph, cur: np.ndarray, L: Layer, il: int) -> tuple[np.ndarray, ...]:
        """The fused projection (+ bias), clamped, split."""
        hp = g.hparams
        qkv = g.linear(cur, L.attn_qkv, L.attn_qkv_bias)                      # [n_tokens, n_embd + 2 * n_embd_gqa]
        g.clamp_kqv(qkv)
        return g.split(qkv, hp.n_embd, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il))
