"""Ling 2.0 / Ring 2.0 (bailingmoe2): Llama's block with a fused QKV projection, per-head Q/K RMS
norms before split-half (partial) RoPE, and DeepSeek's mixture of experts
(:class:`gguflm.models.llama.RoutedExperts`: the file's gating, usually sigmoid with the selection
bias, group-limited, normalised and scaled; dense leading layers; ungated shared experts
``expert_shared_feed_forward_length`` wide, or the routed ones' width). The NextN block at the
end of the file is skipped, as llama.cpp skips it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType, drop_nextn_layers, read_routed_expert_hparams
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama, RoutedExperts

if TYPE_CHECKING:
    from gguflm.model import Layer


class Bailingmoe2(RoutedExperts, Llama):
    name = "bailingmoe2"
    rope_type = RopeType.NEOX
    required_output = True
    attention_bias = False
    qk_norm = True
    heads_span_embd = True   # the fused projection's Q part is n_embd wide

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = drop_nextn_layers(kv, cls.read_common(kv, n_vocab))
        kv.get_float("{arch}.attention.layer_norm_rms_epsilon")   # required
        if hp.n_embd_head_k != hp.n_embd_head_v:
            raise HParamError(f"{kv.source}: bailingmoe2 needs key_length = value_length, found "
                              f"{hp.n_embd_head_k} and {hp.n_embd_head_v}")
        hp = read_routed_expert_hparams(kv, hp)
        n_shared = hp.n_ff_shexp // hp.n_ff_exp
        return hp.with_changes(n_ff_shexp=kv.get_int("{arch}.expert_shared_feed_forward_length", 0) * n_shared
                               or hp.n_ff_shexp)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += [TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)),
                      TensorSpec(f"{blk}.attn_qkv.weight", (hp.n_embd, hp.n_embd + 2 * hp.n_embd_k_gqa(il))),
                      TensorSpec(f"{blk}.attn_output.weight", (hp.n_embd_head_k * hp.n_head[il], hp.n_embd)),
                      TensorSpec(f"{blk}.attn_q_norm.weight", (hp.n_embd_head_k,)),
                      TensorSpec(f"{blk}.attn_k_norm.weight", (hp.n_embd_head_k,)),
                      TensorSpec(f"{blk}.ffn_norm.weight", (hp.n_embd,))]
            specs += cls.ffn_or_expert_specs(hp, il)
        return specs

    def qkv(self, g: Graph, cur: np.ndarray, L: Layer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One projection to Q, K and V, cut into them."""
        (qkv,) = g.project(cur, L.attn_qkv)
        il = L.index
        return g.split(qkv, g.hparams.n_embd, g.hparams.n_embd_k_gqa(il), g.hparams.n_embd_v_gqa(il))
