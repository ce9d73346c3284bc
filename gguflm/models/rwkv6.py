"""RWKV-6 (Finch): LayerNorms, then a time mix and a channel mix per block, both fed by the token
shift (each token's normed row and its predecessor's), as llama.cpp's ``src/models/rwkv6.cpp`` and
``rwkv6-base.cpp``. The time mix: data-dependent lerps (a low-rank ``w1``/``w2`` over the shifted
difference), receptance, key, value and gate projections, a decay per token and channel from its
own low-rank projection, the WKV recurrence over a head_size x head_size state per head, a group
norm per head, the gate, the output projection. The channel mix: two lerps, sigmoid(receptance) *
value(relu(key)^2). The memory is recurrent: two token-shift rows and the WKV states per sequence
and layer (:mod:`gguflm.memory_recurrent`)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from gguflm.errors import ModelLoadError
from gguflm.hparams import HParamReader, HParams, RopeType
from gguflm.loader import Weight
from gguflm.models.base import Architecture, TensorSpec

N_LERP = 5   # RWKV-6's token-shift mixes: w, k, v, r, g


class Rwkv6(Architecture):
    name = "rwkv6"
    rope_type = RopeType.NONE
    memory = "recurrent"
    required_output = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_rwkv_hparams(kv, n_vocab)
        extras = dict(hp.extras,
                      time_mix_extra_dim=kv.positive("time_mix_extra_dim", kv.get_int("{arch}.time_mix_extra_dim")),
                      time_decay_extra_dim=kv.positive("time_decay_extra_dim",
                                                       kv.get_int("{arch}.time_decay_extra_dim")),
                      rescale_every_n_layers=kv.get_int("{arch}.rescale_every_n_layers", 0))
        return hp.with_changes(extras=extras)

    # token-shift rows per layer: the time mix's and the channel mix's (llama.cpp asserts it)
    token_shift_count: ClassVar[int] = 2

    @classmethod
    def read_rwkv_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        """The keys every RWKV reads: sizes, the norms' epsilons, ``wkv.head_size`` and
        ``token_shift_count`` (which must be the architecture's)."""
        n_layer = kv.positive("block_count", kv.get_int("{arch}.block_count"))
        n_embd = kv.positive("embedding_length", kv.get_int("{arch}.embedding_length"))
        head_size = kv.positive("wkv.head_size", kv.get_int("{arch}.wkv.head_size"))
        if n_embd % head_size:
            raise ModelLoadError(f"{kv.source}: embedding_length {n_embd} is not a multiple of wkv.head_size {head_size}")
        if kv.get_int("{arch}.token_shift_count", 2) != cls.token_shift_count:
            raise ModelLoadError(f"{kv.source}: token_shift_count must be {cls.token_shift_count} for {kv.arch}")
        n_ff = kv.per_layer("{arch}.feed_forward_length", n_layer)
        n_head = kv.per_layer("{arch}.attention.head_count", n_layer, default=0)
        return HParams(arch=kv.arch, n_vocab=n_vocab, n_ctx_train=kv.get_int("{arch}.context_length"),
                       n_embd=n_embd, n_layer=n_layer, n_ff=n_ff, n_head=n_head,
                       n_head_kv=kv.per_layer("{arch}.attention.head_count_kv", n_layer, default=list(n_head)),
                       n_embd_head_k=0, n_embd_head_v=0, n_rot=0,
                       f_norm_eps=kv.get_float("{arch}.attention.layer_norm_epsilon", 0.0),
                       f_norm_rms_eps=kv.get_float("{arch}.attention.layer_norm_rms_epsilon", 0.0),
                       rope_type=cls.rope_type, extras={"head_size": head_size})

    @classmethod
    def state_sizes(cls, hp: HParams) -> tuple[int, int]:
        # the token-shift rows; a head_size x head_size state per head
        return cls.token_shift_count * hp.n_embd, hp.n_embd * hp.extras["head_size"]

    @classmethod
    def rwkv_specs(cls, hp: HParams) -> list[TensorSpec]:
        """The tensors outside the blocks and the LayerNorms in them, shared by every RWKV."""
        specs = cls.output_specs(hp) + cls.norm_specs("token_embd_norm", hp.n_embd) + \
            [TensorSpec("output_norm.bias", (hp.n_embd,))]
        for il in range(hp.n_layer):
            specs += cls.norm_specs(f"blk.{il}.attn_norm", hp.n_embd) + cls.norm_specs(f"blk.{il}.attn_norm_2", hp.n_embd)
        return specs

    # QRWKV-6 (RWKV6Qwen2): no time_mix_first means gated linear attention with a sigmoid gate
    # and no group norm; K and V may have fewer heads, R, K and V biases
    qrwkv: ClassVar[bool] = False

    @classmethod
    def time_mix_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        """RWKV-6's time-mix tensors of block ``il``."""
        x = hp.extras
        blk, e, hs, mix, decay = f"blk.{il}", hp.n_embd, x["head_size"], x["time_mix_extra_dim"], x["time_decay_extra_dim"]
        n_kv = hp.n_head_kv[il] * hs if hp.n_head_kv[il] else e
        specs = [
            TensorSpec(f"{blk}.time_mix_w1.weight", (e, mix * N_LERP)),
            TensorSpec(f"{blk}.time_mix_w2.weight", (mix, e, N_LERP)),
            TensorSpec(f"{blk}.time_mix_lerp_x.weight", (e, 1, 1)),
            TensorSpec(f"{blk}.time_mix_lerp_fused.weight", (e, 1, 1, N_LERP), optional=not cls.qrwkv),
            TensorSpec(f"{blk}.time_mix_first.weight", (hs, e // hs), optional=cls.qrwkv),
            TensorSpec(f"{blk}.time_mix_decay.weight", (e,)),
            TensorSpec(f"{blk}.time_mix_decay_w1.weight", (e, decay)),
            TensorSpec(f"{blk}.time_mix_decay_w2.weight", (decay, e)),
            TensorSpec(f"{blk}.time_mix_key.weight", (e, n_kv)),
            TensorSpec(f"{blk}.time_mix_value.weight", (e, n_kv)),
            TensorSpec(f"{blk}.time_mix_receptance.weight", (e, e)),
            TensorSpec(f"{blk}.time_mix_gate.weight", (e, e)),
            TensorSpec(f"{blk}.time_mix_output.weight", (e, e)),
        ]
        if cls.qrwkv:
            return specs + [TensorSpec(f"{blk}.time_mix_{m}.bias", (n,), optional=True)
                            for m, n in (("key", n_kv), ("value", n_kv), ("receptance", e))]
        return specs + [*(TensorSpec(f"{blk}.time_mix_lerp_{c}.weight", (e, 1, 1), optional=True) for c in "wkvrg"),
                        *cls.norm_specs(f"{blk}.time_mix_ln", e)]

    # whether the channel mix gates its output by a receptance (RWKV-6; RWKV-7's does not)
    channel_mix_receptance: ClassVar[bool] = True

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.rwkv_specs(hp)
        for il in range(hp.n_layer):
            blk, e, f = f"blk.{il}", hp.n_embd, hp.n_ff[il]
            specs += cls.time_mix_specs(hp, il) + [
                TensorSpec(f"{blk}.channel_mix_lerp_k.weight", (e, 1, 1)),
                TensorSpec(f"{blk}.channel_mix_key.weight", (e, f)),
                TensorSpec(f"{blk}.channel_mix_value.weight", (f, e)),
            ]
            if cls.channel_mix_receptance:
                specs += [TensorSpec(f"{blk}.channel_mix_lerp_r.weight", (e, 1, 1)),
                          TensorSpec(f"{blk}.channel_mix_receptance.weight", (e, e))]
        return specs

    @staticmethod
    def lerp_rows(L: Any) -> Weight:
        """The five mixes' rows (w, k, v, r, g): the fused tensor, or the separate ones stacked."""
        if L.time_mix_lerp_fused is not None:
            return L.time_mix_lerp_fused
        parts = [getattr(L, f"time_mix_lerp_{c}") for c in "wkvrg"]
        if any(p is None for p in parts):
            raise ModelLoadError(f"block {L.index} has neither time_mix_lerp_fused nor all of time_mix_lerp_w/k/v/r/g")
        return Weight(parts[0].name, parts[0].type, (parts[0].shape[0], N_LERP),
                      np.concatenate([p.data.reshape(1, -1) for p in parts]))

    def time_mix(self, g: Any, il: int, L: Any, cur: Any, prev: Any, carry: dict[str, Any]) -> Any:
        """llm_build_rwkv6_base::build_rwkv6_time_mix; ``carry``: what a block hands the next
        ones (RWKV-7's first value; nothing here)."""
        hp = g.hparams
        mix, hs = hp.extras["time_mix_extra_dim"], hp.extras["head_size"]
        qrwkv = L.time_mix_first is None
        (xxx,) = g.wkv_lerp(cur, prev, L.time_mix_lerp_x)                      # sx * lerp_x + cur
        (lo,) = g.project(xxx, L.time_mix_w1)                                  # [n_tokens, 5 * mix]
        lo = g.tanh(lo)
        w2 = L.time_mix_w2
        rows = w2.data.shape[0] // N_LERP
        adds = [g.project_per_row(lo[:, k * mix:(k + 1) * mix],
                                  Weight(w2.name, w2.type, (mix, rows), w2.data[k * rows:(k + 1) * rows]))
                for k in range(N_LERP)]
        xw, xk, xv, xr, xg = g.wkv_lerp(cur, prev, self.lerp_rows(L), adds)   # (adds + mu) * sx + cur
        r = g.add_bias(g.project(xr, L.time_mix_receptance)[0], getattr(L, "time_mix_receptance_bias", None))
        k = g.add_bias(g.project(xk, L.time_mix_key)[0], getattr(L, "time_mix_key_bias", None))
        v = g.add_bias(g.project(xv, L.time_mix_value)[0], getattr(L, "time_mix_value_bias", None))
        (gate,) = g.project(xg, L.time_mix_gate)
        if k.shape[1] != hp.n_embd:   # grouped K/V heads, each repeated for its queries
            k, v = g.wkv_repeat_heads(k, hp.n_embd), g.wkv_repeat_heads(v, hp.n_embd)
        (dw,) = g.project(g.tanh(g.project(xw, L.time_mix_decay_w1)[0]), L.time_mix_decay_w2)
        w = g.wkv_map("decay6", dw, p=L.time_mix_decay, out=dw)                 # exp(-exp(dw + decay))
        if qrwkv:   # k * (1 - w), gated linear attention, a sigmoid gate
            k = g.wkv_map("key_decay", k, w, out=k)
            # llama.cpp passes pow(head_size, -0.5f) (a double) as a float
            y = g.wkv_gla(il, k, v, r, w, float(np.float32(hs ** -0.5)))
            return g.project(g.wkv_map("sigmoid_mul", gate, y, out=y), L.time_mix_output)[0]
        y = g.wkv6(il, k, v, r, L.time_mix_first, w)
        y = g.wkv_group_norm(y, L.time_mix_ln, L.time_mix_ln_bias)
        y = g.swiglu(gate, y)                                                  # y * silu(gate)
        return g.project(y, L.time_mix_output)[0]

    def channel_mix(self, g: Any, L: Any, cur: Any, prev: Any) -> Any:
        """build_rwkv6_channel_mix: sigmoid(receptance(xr)) * value(relu(key(xk))^2)."""
        xk, xr = g.wkv_lerp(cur, prev, L.channel_mix_lerp_k), g.wkv_lerp(cur, prev, L.channel_mix_lerp_r)
        (r,) = g.project(xr[0], L.channel_mix_receptance)
        (k,) = g.project(xk[0], L.channel_mix_key)
        (v,) = g.project(g.wkv_map("relu_sqr", k, out=k), L.channel_mix_value)
        return g.wkv_map("sigmoid_mul", r, v, out=v)

    def forward(self, g: Any) -> tuple[Any, Any]:
        hp, tensors = g.hparams, g.model.tensors
        rescale = hp.extras.get("rescale_every_n_layers", 0)
        carry: dict[str, Any] = {}
        g.recurrent_moves()
        x = g.embed(tensors["token_embd.weight"])                              # [n_tokens, n_embd]
        x = g.layer_norm(x, tensors["token_embd_norm.weight"], tensors["token_embd_norm.bias"])
        for il, L in g.layers():
            att_norm = g.layer_norm(x, L.attn_norm, L.attn_norm_bias)
            cur = self.time_mix(g, il, L, att_norm, g.wkv_shift(il, att_norm, 0), carry)
            ffn_inp = g.add(cur, x)
            ffn_norm = g.layer_norm(ffn_inp, L.attn_norm_2, L.attn_norm_2_bias)
            prev = g.wkv_shift(il, ffn_norm, 1)
            if il == hp.n_layer - 1:
                ffn_inp, ffn_norm, prev = g.output_rows(ffn_inp, ffn_norm, prev)
            cur = g.add(self.channel_mix(g, L, ffn_norm, prev), ffn_inp)
            if rescale and (il + 1) % rescale == 0:
                g.scale(cur, 0.5)
            x = cur
        x = g.layer_norm(x, tensors["output_norm.weight"], tensors["output_norm.bias"])
        return x, g.logits(x, tensors["output.weight"])


class FeedForwardBody:
    """What the RWKV time mixes distilled into a transformer (ARWKV-7, RWKV6Qwen2) share, as
    llama.cpp's arwkv7.cpp and rwkv6qwen2.cpp build it: RMSNorms, one token-shift row, the time
    mix, then a SwiGLU feed-forward instead of the channel mix. Mixed in before the RWKV class
    whose time mix it runs."""

    token_shift_count = 1   # the time mix's row only

    @classmethod
    def body_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        blk = f"blk.{il}"
        return [TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)), TensorSpec(f"{blk}.ffn_norm.weight", (hp.n_embd,)),
                *Architecture.ffn_specs(hp, il)]

    def forward(self, g: Any) -> tuple[Any, Any]:
        hp, tensors = g.hparams, g.model.tensors
        carry: dict[str, Any] = {}
        g.recurrent_moves()
        x = g.embed(tensors["token_embd.weight"])                              # [n_tokens, n_embd]
        for il, L in g.layers():
            att_norm = g.rms_norm(x, L.attn_norm)
            cur = self.time_mix(g, il, L, att_norm, g.wkv_shift(il, att_norm, 0), carry)
            ffn_inp = g.add(cur, x)
            if il == hp.n_layer - 1:
                (ffn_inp,) = g.output_rows(ffn_inp)
            gate, up = g.project(g.rms_norm(ffn_inp, L.ffn_norm), L.ffn_gate, L.ffn_up)
            (cur,) = g.project(g.swiglu(gate, up), L.ffn_down)
            x = g.add(cur, ffn_inp)
        x = g.add_bias(g.rms_norm(x, tensors["output_norm.weight"]), tensors.get("output_norm.bias"))
        return x, g.logits(x, tensors["output.weight"])
