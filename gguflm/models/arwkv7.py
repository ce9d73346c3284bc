"""ARWKV-7 (RWKV-7 time mixing distilled into a transformer's body): RMSNorms, RWKV-7's time mix
(its gate and group norm optional) on one token-shift row, then a SwiGLU feed-forward instead of
the channel mix, as llama.cpp's ``src/models/arwkv7.cpp``. The memory is recurrent, as RWKV-7's."""

from __future__ import annotations

from typing import Any

from gguflm.hparams import HParams
from gguflm.models.base import TensorSpec
from gguflm.models.rwkv7 import Rwkv7


class Arwkv7(Rwkv7):
    name = "arwkv7"
    token_shift_count = 1   # the time mix's row only
    optional_gate_and_norm = True

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += [TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)), TensorSpec(f"{blk}.ffn_norm.weight", (hp.n_embd,))]
            specs += cls.time_mix_specs(hp, il) + cls.ffn_specs(hp, il)
        return specs

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
        x = g.rms_norm(x, tensors["output_norm.weight"])
        return x, g.logits(x, tensors["output.weight"])
