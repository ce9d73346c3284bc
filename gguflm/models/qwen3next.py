"""Qwen3-Next (llama.cpp's ``src/models/qwen3next.cpp``): Qwen3.5-MoE's blocks
(:mod:`gguflm.models.qwen35moe`) with plain split-half RoPE, beta and alpha from one projection
(``ssm_ba``: per key head, its value heads' betas then their alphas), and each key head repeated
for its value heads before the recurrence (interleaved: value head h reads key head h * n_k / n_v).
Only files with the fused Q/K/V projection (``attn_qkv``, ``attn_gate``) are supported, not the
early conversions' ``ssm_in``."""

from __future__ import annotations

from typing import Any

from gguflm.errors import ModelLoadError
from gguflm.hparams import HParamReader, HParams
from gguflm.models.base import TensorSpec
from gguflm.models.qwen35moe import Qwen35Moe


class Qwen3Next(Qwen35Moe):
    name = "qwen3next"

    @classmethod
    def check_rope_sections(cls, kv: HParamReader, hp: HParams) -> None:
        """Plain RoPE: no sections."""

    @classmethod
    def read_moe(cls, kv: HParamReader, hp: HParams) -> HParams:
        if kv.get_int("{arch}.expert_count", 0) == 0:
            raise ModelLoadError(f"{kv.source}: a qwen3next model cannot have zero experts")
        return super().read_moe(kv, hp)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        n_v = hp.extras["n_v_heads"]
        specs = []
        for spec in super().tensor_specs(hp):
            if spec.name.endswith((".ssm_beta.weight", ".ssm_alpha.weight")):
                if spec.name.endswith(".ssm_beta.weight"):
                    specs.append(TensorSpec(spec.name.replace("ssm_beta", "ssm_ba"), (hp.n_embd, 2 * n_v)))
                continue
            specs.append(spec)
        return specs

    @staticmethod
    def projections(g: Any, cur: Any, L: Any) -> tuple[Any, ...]:
        gdn = g.hparams.extras
        n, n_k, per_k = cur.shape[0], gdn["n_k_heads"], gdn["n_v_heads"] // gdn["n_k_heads"]
        qkv, z, ba = g.project(cur, L.attn_qkv, L.attn_gate, L.ssm_ba)   # ba: [n, n_k * (betas, alphas)]
        beta, alpha = g.split(ba.reshape(n * n_k, 2 * per_k), per_k, per_k)
        return qkv, z, beta.reshape(n, -1), alpha.reshape(n, -1)

    @staticmethod
    def key_heads(g: Any, q: Any, k: Any) -> tuple[Any, Any]:
        gdn = g.hparams.extras
        repeat = gdn["n_v_heads"] // gdn["n_k_heads"]
        if repeat == 1:
            return q, k
        return g.repeat_heads(q, gdn["d_state"], repeat), g.repeat_heads(k, gdn["d_state"], repeat)
