"""Gemma 2: scaled embeddings, post-attention and post-FFN norms, GELU-gated FFN, soft-capped
attention and final logits, every other layer on a sliding window.

Its forward pass also serves Gemma 3 (per-head Q/K norms) and Gemma 1 (no post-norms)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamReader, HParams, RopeType, rsqrt_f32, sqrt_f32, swa_pattern
from gguflm.models.base import Architecture, TensorSpec


class Gemma2(Architecture):
    name = "gemma2"
    rope_type = RopeType.NEOX
    untied_output = False
    # the optional parts of the block this graph runs, as the architecture declares their tensors:
    # per-head Q/K RMS norms (Gemma 3), branch outputs normed before the residual add (not Gemma 1)
    qk_norm: ClassVar[bool] = False
    post_norms: ClassVar[bool] = True
    # whether embeddings a batch gives in place of tokens are scaled as looked-up rows are (Gemma 1
    # and 2); llama.cpp's Gemma 3 graphs take them as they are (encoded images)
    scale_given_embeddings: ClassVar[bool] = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        # the 27B model (46 layers) scales queries by 1/sqrt(n_embd / n_head)
        head_for_scale = hp.n_embd // hp.n_head[0] if hp.n_layer == 46 else hp.n_embd_head_k
        return hp.with_changes(
            n_swa=kv.get_int("{arch}.attention.sliding_window", 4096),
            swa_layers=swa_pattern(hp.n_layer, 2),
            f_attn_logit_softcapping=kv.get_float("{arch}.attn_logit_softcapping", 50.0),
            f_final_logit_softcapping=kv.get_float("{arch}.final_logit_softcapping", 30.0),
            f_attention_scale=rsqrt_f32(head_for_scale),
            f_embedding_scale=sqrt_f32(hp.n_embd),
        )

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.attention_specs(hp, il)
            specs += [
                TensorSpec(f"{blk}.post_attention_norm.weight", (hp.n_embd,)),
                TensorSpec(f"{blk}.ffn_norm.weight", (hp.n_embd,)),
            ]
            specs += cls.ffn_specs(hp, il)
            specs.append(TensorSpec(f"{blk}.post_ffw_norm.weight", (hp.n_embd,)))
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        x = self.hidden(g)
        return x, g.logits(x, g.model.tensors["output.weight"])              # [n_outputs, n_vocab]

    def hidden(self, g: Graph) -> np.ndarray:
        """The blocks and the final norm: the output rows' hidden states [n_outputs, n_embd]."""
        hp, m = g.hparams, g.model
        scaled = g.ub.tokens is not None or self.scale_given_embeddings
        x = g.embed(m.tensors["token_embd.weight"], scale=hp.f_embedding_scale if scaled else 0.0)  # [n_tokens, n_embd]
        for il, L in g.layers():
            # self-attention (Gemma 2 soft-caps the scores, Gemma 3 norms queries and keys)
            cur = g.rms_norm(x, L.attn_norm)
            q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)            # [n_tokens, n_head(_kv) * head_dim]
            g.rope_qk(q, k, il, *((L.attn_q_norm, L.attn_k_norm) if self.qk_norm else ()))
            g.scale(q, hp.f_attention_scale)
            cur = g.attention(il, q, k, v, 1.0)                               # [n_tokens, n_head * head_dim]
            (cur,) = g.project(cur, L.attn_output)                            # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                # [n_outputs, n_embd]
            if self.post_norms:                                               # not in Gemma 1
                cur = g.rms_norm(cur, L.post_attention_norm)
            x = g.add(cur, x)
            # feed-forward, GELU-gated, normed after as well as before
            cur = g.rms_norm(x, L.ffn_norm)
            gate, up = g.project(cur, L.ffn_gate, L.ffn_up)                   # [n, n_ff]
            (cur,) = g.project(g.geglu(gate, up), L.ffn_down)                 # [n, n_embd]
            if self.post_norms:
                cur = g.rms_norm(cur, L.post_ffw_norm)
            x = g.add(cur, x)
        return g.rms_norm(x, m.tensors["output_norm.weight"])

