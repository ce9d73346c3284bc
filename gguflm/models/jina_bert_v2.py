"""jina-bert-v2 (jina-embeddings-v2, jina-reranker-v1): BERT's encoder without positions in the
input: attention takes ALiBi biases (maximum 8) instead. Optional LayerNorms of Q and K and a
second LayerNorm after attention; a GELU-gated feed-forward whose gate is its own matrix or the
first half of the up projection."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.bert import Bert


class JinaBertV2(Bert):
    name = "jina-bert-v2"
    rope_type = RopeType.NONE
    rotary = False
    token_types_optional = False
    requires_token_type_count = False
    extra_norms = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        return super().read_hparams(kv, n_vocab).with_changes(f_max_alibi_bias=8.0)

    @classmethod
    def max_positions(cls, hp: HParams) -> int | None:
        return None

    @classmethod
    def embedding_specs(cls, hp: HParams) -> list[TensorSpec]:
        return [s for s in super().embedding_specs(hp) if s.name != "position_embd.weight"]

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.embedding_specs(hp) + cls.classifier_specs(hp, n_hidden=1, output=False)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += cls.qkv_specs(hp, il)
            specs += cls.norm_specs(f"{blk}.attn_q_norm", hp, optional=True)
            # llama.cpp declares n_embd and fails building the graph when K is narrower (GQA)
            specs += [TensorSpec(f"{blk}.attn_k_norm.{kind}", (hp.n_embd_k_gqa(il),), optional=True)
                      for kind in ("weight", "bias")]
            specs += [TensorSpec(f"{blk}.attn_output.weight", (hp.n_embd, hp.n_embd)),
                      TensorSpec(f"{blk}.attn_output.bias", (hp.n_embd,))]
            specs += cls.norm_specs(f"{blk}.attn_output_norm", hp)
            specs += cls.norm_specs(f"{blk}.attn_norm_2", hp, optional=True)
            specs += cls.ffn_tensor_specs(hp, il)
            specs += cls.norm_specs(f"{blk}.layer_output_norm", hp)
        return specs

    @classmethod
    def ffn_tensor_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        # the up projection is n_ff wide with a gate matrix beside it, or 2 * n_ff wide (gate | up)
        blk, n_ff = f"blk.{il}", hp.n_ff[il]
        return [TensorSpec(f"{blk}.ffn_gate.weight", (hp.n_embd, n_ff), optional=True),
                TensorSpec(f"{blk}.ffn_up.weight", (hp.n_embd, n_ff), alt_shapes=((hp.n_embd, 2 * n_ff),)),
                TensorSpec(f"{blk}.ffn_up.bias", (n_ff,), optional=True, alt_shapes=((2 * n_ff,),)),
                TensorSpec(f"{blk}.ffn_down.weight", (hp.n_ff[il], hp.n_embd)),
                TensorSpec(f"{blk}.ffn_down.bias", (hp.n_embd,))]

    def ffn(self, g: Graph, L, il: int, x: np.ndarray) -> np.ndarray:
        n_ff = g.hparams.n_ff[il]
        if L.ffn_gate is not None:
            up = g.linear(x, L.ffn_up, L.ffn_up_bias)
            (gate,) = g.project(x, L.ffn_gate)
        elif L.ffn_up.shape[1] == 2 * n_ff:
            gate, up = g.split(g.linear(x, L.ffn_up, L.ffn_up_bias), n_ff, n_ff)
        else:
            raise HParamError(f"layer {il}: ffn_up has {L.ffn_up.shape[1]} rows and no ffn_gate; "
                              f"expected {2 * n_ff} (gate and up)")
        return g.linear(g.geglu(gate, up), L.ffn_down, L.ffn_down_bias)
