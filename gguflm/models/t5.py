"""T5 and FLAN-T5 (encoder-decoder): the encoder is :mod:`gguflm.models.t5encoder`'s,
run by ``Context.encode`` (llama_encode), which keeps its output; the decoder, run by
``Context.decode`` from the decoder start token on, has per layer: RMS norm, causal
self-attention over its KV cache with bucket biases over past positions (from the first layer's
``attn_rel_b`` where a layer has none), RMS norm, cross-attention over K and V projected from the
encoder's output, RMS norm and the same feed-forward as the encoder's; then the output projection
(the token embedding where the file has none)."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams
from gguflm.models.base import TensorSpec
from gguflm.models.t5encoder import T5Encoder


class T5(T5Encoder):
    name = "t5"
    kv_cache = True
    has_decoder = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        n_dec = kv.get_int("{arch}.decoder_block_count", hp.n_layer)
        if not 1 <= n_dec <= hp.n_layer:
            # llama.cpp sizes its KV cache and per-layer parameters by the encoder's layer count
            raise HParamError(f"{kv.source}: {n_dec} decoder layers; gguflm runs 1 to block_count "
                              f"({hp.n_layer})")
        return hp.with_changes(extras={**hp.extras, "dec_n_layer": n_dec,
                                       "decoder_start_token_id": kv.get_int("{arch}.decoder_start_token_id", -1)})

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = super().tensor_specs(hp) + [
            TensorSpec("dec.output_norm.weight", (hp.n_embd,)),
            TensorSpec("output.weight", (hp.n_embd, hp.n_vocab), optional=True, fallback="token_embd.weight")]
        for il in range(hp.extras["dec_n_layer"]):
            # llama.cpp loads cross_attn_rel_b where the file has it and never uses it
            specs += cls.t5_block_specs(hp, "dec", il, ("attn", "cross_attn"))
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray | None]:
        if g.encoding:
            return self.encode(g), None
        t = g.model.tensors
        n_dec = g.hparams.extras["dec_n_layer"]
        enc = g.ctx.cross_source()
        x = g.embed(t["token_embd.weight"])                                   # [n_tokens, n_embd]
        for il, _ in g.layers():
            if il >= n_dec:
                continue
            b = f"dec.blk.{il}"
            # causal self-attention with bucket biases
            cur = g.rms_norm(x, t[f"{b}.attn_norm.weight"])
            q, k, v = g.project(cur, t[f"{b}.attn_q.weight"], t[f"{b}.attn_k.weight"], t[f"{b}.attn_v.weight"])
            cur = g.attention(il, q, k, v, 1.0, rel_bias=self.rel_bias(g, "dec", "attn", il))
            (cur,) = g.project(cur, t[f"{b}.attn_o.weight"])
            cross_inp = g.add(cur, x)
            # cross-attention over the encoder's output
            cur = g.rms_norm(cross_inp, t[f"{b}.cross_attn_norm.weight"])
            (q,) = g.project(cur, t[f"{b}.cross_attn_q.weight"])
            k, v = g.project(enc.embd, t[f"{b}.cross_attn_k.weight"], t[f"{b}.cross_attn_v.weight"])  # [n_enc, ...]
            cur = g.cross_attention(il, q, k, v, enc)
            (cur,) = g.project(cur, t[f"{b}.cross_attn_o.weight"])
            if il == n_dec - 1:
                cur, cross_inp = g.output_rows(cur, cross_inp)
            ffn_inp = g.add(cur, cross_inp)
            cur = self.t5_ffn(g, b, g.rms_norm(ffn_inp, t[f"{b}.ffn_norm.weight"]))
            x = g.add(cur, ffn_inp)
        x = g.rms_norm(x, t["dec.output_norm.weight"])
        return x, g.logits(x, t["output.weight"])
