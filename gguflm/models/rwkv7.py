"""RWKV-7 (Goose): RWKV-6's block layout (LayerNorms, token shift, time mix, channel mix; llama.cpp's
``src/models/rwkv7.cpp`` and ``rwkv7-base.cpp``) with RWKV-7's time mix: six plain lerps; low-rank
projections for the decay (w0/w1/w2), the in-context learning rate a (a0/a1/a2), the gate (g1/g2)
and, after the first block, the value's mix with the first block's value (v0/v1/v2); keys
normalised per head; the generalised delta rule of ``rwkv_wkv7``; a per-head bonus of the current
token; the channel mix is value(relu(key)^2). The memory is recurrent, as RWKV-6's."""

from __future__ import annotations

from typing import Any, ClassVar

from gguflm._ext.wkv import WKV7_HEAD_MULTIPLE
from gguflm.errors import ModelLoadError
from gguflm.hparams import HParamReader, HParams
from gguflm.models.base import TensorSpec
from gguflm.models.rwkv6 import Rwkv6

N_LERP = 6   # RWKV-7's token-shift mixes: r, w, k, v, a, g


class Rwkv7(Rwkv6):
    name = "rwkv7"
    channel_mix_receptance = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_rwkv_hparams(kv, n_vocab)
        ranks = {name: kv.positive(f"attention.{key}", kv.get_int(f"{{arch}}.attention.{key}"))
                 for name, key in (("decay", "decay_lora_rank"), ("iclr", "iclr_lora_rank"),
                                   ("value_mix", "value_residual_mix_lora_rank"))}
        ranks["gate"] = kv.get_int("{arch}.attention.gate_lora_rank", 0)   # absent: no gate (ARWKV-7)
        if hp.extras["head_size"] % WKV7_HEAD_MULTIPLE:
            raise ModelLoadError(f"{kv.source}: wkv.head_size {hp.extras['head_size']} is not a multiple of "
                                 f"{WKV7_HEAD_MULTIPLE}, which ggml's rwkv_wkv7 loops assume")
        return hp.with_changes(extras=dict(hp.extras, lora=ranks))

    # whether the gate (g1, g2; a sixth lerp) and the group norm may be absent (ARWKV-7)
    optional_gate_and_norm: ClassVar[bool] = False

    @classmethod
    def time_mix_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        """RWKV-7's time-mix tensors of block ``il``."""
        blk, e, lora = f"blk.{il}", hp.n_embd, hp.extras["lora"]
        value_rank = lora["iclr"] if il == 0 else lora["value_mix"]   # block 0's are read, never used
        optional = cls.optional_gate_and_norm
        lerps = (e, 1, 1, N_LERP)
        return [
            *cls.lora_specs(f"{blk}.time_mix", "w", e, lora["decay"]),
            *cls.lora_specs(f"{blk}.time_mix", "a", e, lora["iclr"]),
            *cls.lora_specs(f"{blk}.time_mix", "v", e, value_rank),
            TensorSpec(f"{blk}.time_mix_g1.weight", (e, lora["gate"]), optional=optional),
            TensorSpec(f"{blk}.time_mix_g2.weight", (lora["gate"], e), optional=optional),
            TensorSpec(f"{blk}.time_mix_lerp_fused.weight", lerps,
                       alt_shapes=((e, 1, 1, N_LERP - 1),) if optional else ()),
            TensorSpec(f"{blk}.time_mix_k_k.weight", (e,)),
            TensorSpec(f"{blk}.time_mix_k_a.weight", (e,)),
            TensorSpec(f"{blk}.time_mix_r_k.weight", (e,)),
            TensorSpec(f"{blk}.time_mix_key.weight", (e, e)),
            TensorSpec(f"{blk}.time_mix_value.weight", (e, e)),
            TensorSpec(f"{blk}.time_mix_receptance.weight", (e, e)),
            *cls.norm_specs(f"{blk}.time_mix_ln", e, optional=optional),
            TensorSpec(f"{blk}.time_mix_output.weight", (e, e)),
        ]

    @staticmethod
    def lora_specs(prefix: str, c: str, e: int, rank: int) -> list[TensorSpec]:
        """A low-rank projection's bias row ``{c}0`` and its two matrices ``{c}1`` (e -> rank), ``{c}2``."""
        return [TensorSpec(f"{prefix}_{c}0.weight", (e,)), TensorSpec(f"{prefix}_{c}1.weight", (e, rank)),
                TensorSpec(f"{prefix}_{c}2.weight", (rank, e))]

    def time_mix(self, g: Any, il: int, L: Any, cur: Any, prev: Any, carry: dict[str, Any]) -> Any:
        """llm_build_rwkv7_base::build_rwkv7_time_mix; the first block's value is kept in
        ``carry`` for the later ones."""
        xr, xw, xk, xv, xa, *xg = g.wkv_lerp(cur, prev, L.time_mix_lerp_fused)   # xg: with a gate only
        (r,) = g.project(xr, L.time_mix_receptance)
        (dw,) = g.project(g.tanh(g.project(xw, L.time_mix_w1)[0]), L.time_mix_w2)
        w = g.wkv_map("decay7", dw, p=L.time_mix_w0, out=dw)                    # exp(-0.606531 * sigmoid(dw + w0))
        (k,) = g.project(xk, L.time_mix_key)
        (v,) = g.project(xv, L.time_mix_value)
        if il == 0:
            carry["v_first"] = v
        else:   # v += (v_first - v) * sigmoid(v2 @ (v1 @ xv) + v0)
            (mix,) = g.project(g.project(xv, L.time_mix_v1)[0], L.time_mix_v2)
            g.wkv_map("value_mix", v, carry["v_first"], mix, p=L.time_mix_v0, out=v)
        gating = L.time_mix_g1 is not None and L.time_mix_g2 is not None
        if gating:
            (gate,) = g.project(g.wkv_map("sigmoid", g.project(xg[0], L.time_mix_g1)[0]), L.time_mix_g2)
        (a,) = g.project(g.project(xa, L.time_mix_a1)[0], L.time_mix_a2)
        a = g.wkv_map("sigmoid", a, p=L.time_mix_a0, out=a)                     # sigmoid(. + a0)
        neg_kk, kka = g.wkv7_keys(k, a, L.time_mix_k_k, L.time_mix_k_a)
        y = g.wkv7(il, r, w, k, v, neg_kk, kka)
        if L.time_mix_ln is not None and L.time_mix_ln_bias is not None:
            y = g.wkv_group_norm(y, L.time_mix_ln, L.time_mix_ln_bias)
        g.wkv7_bonus(y, k, r, v, L.time_mix_r_k)
        if gating:
            y = g.wkv_map("mul", y, gate, out=y)
        return g.project(y, L.time_mix_output)[0]

    def channel_mix(self, g: Any, L: Any, cur: Any, prev: Any) -> Any:
        """build_rwkv7_channel_mix: value(relu(key(xk))^2)."""
        (xk,) = g.wkv_lerp(cur, prev, L.channel_mix_lerp_k)
        (k,) = g.project(xk, L.channel_mix_key)
        return g.project(g.wkv_map("relu_sqr", k, out=k), L.channel_mix_value)[0]
