"""Qwen3.5-MoE: Qwen3.5's blocks (:mod:`gguflm.models.qwen35`) with routed SwiGLU experts (softmax
gating, the chosen weights normalized) and a shared SwiGLU expert gated by sigmoid(w . x)."""

from __future__ import annotations

from typing import Any

from gguflm.graph import GATING_SOFTMAX
from gguflm.hparams import HParamReader, HParams, read_expert_hparams
from gguflm.models.base import TensorSpec
from gguflm.models.qwen35 import Qwen35


class Qwen35Moe(Qwen35):
    name = "qwen35moe"

    @classmethod
    def read_moe(cls, kv: HParamReader, hp: HParams) -> HParams:
        hp = read_expert_hparams(kv, hp, shared=True)
        return hp if hp.n_ff_shexp else hp.with_changes(n_ff_shexp=hp.n_ff[0])

    @classmethod
    def feed_forward_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        return cls.expert_specs(hp, il) + cls.shared_expert_specs(hp, il, hp.n_ff_shexp) + [
            TensorSpec(f"blk.{il}.ffn_gate_inp_shexp.weight", (hp.n_embd,))]

    def feed_forward(self, g: Any, cur: Any, L: Any) -> Any:
        out = g.moe_ffn(cur, L, norm_w=True, gating=GATING_SOFTMAX, w_scale=g.hparams.expert_weights_scale)
        gate, up = g.project(cur, L.ffn_gate_shexp, L.ffn_up_shexp)       # [n, n_ff_shexp]
        (shared,) = g.project(g.swiglu(gate, up), L.ffn_down_shexp)        # [n, n_embd]
        (shared_gate,) = g.project(cur, L.ffn_gate_inp_shexp.as_matrix())  # [n, 1]
        g.add(out, g.sigmoid_mul(shared, shared_gate))
        return out
