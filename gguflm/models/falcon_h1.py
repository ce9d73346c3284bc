"""Falcon-H1: in every layer, attention (split-half RoPE) and a Mamba-2 block side
by side on the same normed input, their outputs summed into the residual stream, then a SwiGLU
feed-forward (llama.cpp's ``src/models/falcon-h1.cpp``). Falcon-H1's multipliers (embedding,
attention in/out, key, SSM in/out and per-part, MLP, LM head) are folded into the weights by
llama.cpp's converter, so the graph has none. Every layer keeps K and V in the KV cache and a
state in the recurrent memory (llama.cpp's hybrid memory with both filters true).

Its feed-forward (dense, biases optional) is Granite 4's, whose class it extends."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.granitehybrid import GraniteHybrid
from gguflm.models.hybrid import read_hybrid_hparams, require_attention
from gguflm.models.mamba2 import Mamba2


class FalconH1(GraniteHybrid):
    name = "falcon-h1"
    rope_type = RopeType.NEOX

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = read_hybrid_hparams(kv, n_vocab, cls.rope_type)
        require_attention(kv, hp, range(hp.n_layer))
        if any(n <= 0 for n in hp.n_ff):
            raise HParamError(f"{kv.source}: every Falcon-H1 layer has a feed-forward, found feed_forward_length "
                              f"{list(hp.n_ff)}")
        return hp.with_changes(recurrent_layers=(True,) * hp.n_layer)

    @classmethod
    def attention_layers(cls, hp: HParams) -> list[int]:
        return list(range(hp.n_layer))

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += Mamba2.ssm_specs(hp, il, optional_norm=True)
            specs += cls.attention_specs(hp, il, bias=None)   # the output bias is read, never added
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            # the converter names this norm without ".weight" (FFN_PRE_NORM's name is FFN_NORM's)
            specs.append(TensorSpec(f"{blk}.ffn_norm", (hp.n_embd,)))
            specs += cls.ffn_specs(hp, il, biases=True)
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        g.recurrent_moves()
        x = g.embed(m.tensors["token_embd.weight"])                          # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = g.rms_norm(x, L.attn_norm)
            # attention and the Mamba-2 block on the same normed input, summed
            q, k, v = self.qkv(g, cur, L)                                    # [n_tokens, n_head(_kv) * head_dim]
            g.rope_qk(q, k, il)
            attn = g.attention(il, q, k, v, hp.kq_scale)                     # [n_tokens, n_head * head_dim]
            (attn,) = g.project(attn, L.attn_output)                         # [n_tokens, n_embd]
            g.add(attn, Mamba2.mixer(g, il, L, cur))
            g.add(x, attn)
            if il == hp.n_layer - 1:
                (x,) = g.output_rows(x)                                      # [n_outputs, n_embd]
            self.feed_forward(g, L, x)
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                   # [n_outputs, n_vocab]
