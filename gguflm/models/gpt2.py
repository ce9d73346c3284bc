"""GPT-2: learned absolute position embeddings, no RoPE, LayerNorms with biases before attention
and the feed-forward, a fused and biased QKV projection, a biased attention output and a biased
GELU feed-forward (up, GELU, down). StarCoder (1) runs the same graph; GPT-NeoX the same block
with RoPE instead of position embeddings, its feed-forward optionally beside attention."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParams, RopeType
from gguflm.models.base import Architecture, TensorSpec

if TYPE_CHECKING:
    from gguflm.model import Layer


class GPT2(Architecture):
    name = "gpt2"
    rope_type = RopeType.NONE
    heads_span_embd = requires_layer_norm_eps = True
    position_embeddings: ClassVar[bool] = True

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e = hp.n_embd
        specs = cls.output_specs(hp)
        specs.insert(2, TensorSpec("output_norm.bias", (e,)))
        if cls.position_embeddings:
            specs.append(TensorSpec("position_embd.weight", (e, hp.n_ctx_train)))
        for il in range(hp.n_layer):
            blk, f, n_qkv = f"blk.{il}", hp.n_ff[il], e + hp.n_embd_k_gqa(il) + hp.n_embd_v_gqa(il)
            specs += cls.norm_specs(f"{blk}.attn_norm", e)
            specs += [TensorSpec(f"{blk}.attn_qkv.weight", (e, n_qkv)), TensorSpec(f"{blk}.attn_qkv.bias", (n_qkv,)),
                      TensorSpec(f"{blk}.attn_output.weight", (e, e)), TensorSpec(f"{blk}.attn_output.bias", (e,))]
            specs += cls.norm_specs(f"{blk}.ffn_norm", e)
            specs += [TensorSpec(f"{blk}.ffn_down.weight", (f, e)), TensorSpec(f"{blk}.ffn_down.bias", (e,)),
                      TensorSpec(f"{blk}.ffn_up.weight", (e, f)), TensorSpec(f"{blk}.ffn_up.bias", (f,))]
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = self.inputs(g)                                                    # [n_tokens, n_embd]
        for il, L in g.layers():
            # self-attention
            cur = g.layer_norm(x, L.attn_norm, L.attn_norm_bias)
            q, k, v = self.qkv(g, cur, L, il)                                 # [n_tokens, n_head(_kv) * head_dim]
            g.rope_qk(q, k, il)
            cur = g.attention(il, q, k, v, self.kq_scale(hp))                 # [n_tokens, n_embd]
            cur = g.linear(cur, L.attn_output, L.attn_output_bias)
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                # [n_outputs, n_embd]
            if hp.use_par_res:   # x + ffn(ln2(x)) + attention, all from the same x
                x = g.add(g.add(self.ffn(g, x, L), x), cur)
            else:
                g.add(x, cur)
                g.add(x, self.ffn(g, x, L))
        x = g.layer_norm(x, m.tensors["output_norm.weight"], m.tensors.get("output_norm.bias"))
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]

    def inputs(self, g: Graph) -> np.ndarray:
        """The token embeddings, plus the position embeddings where the model has them."""
        x = g.embed(g.model.tensors["token_embd.weight"])
        positions = g.model.tensors.get("position_embd.weight")
        if positions is not None:
            g.add(x, g.position_rows(positions))
        return x

    @staticmethod
    def qkv(g: Graph, cur: np.ndarray, L: Layer, il: int) -> tuple[np.ndarray, ...]:
        """Q, K and V from the fused projection (and its bias where the block has one)."""
        hp = g.hparams
        qkv = g.linear(cur, L.attn_qkv, L.attn_qkv_bias)                      # [n_tokens, n_embd + 2 * n_embd_gqa]
        return g.split(qkv, hp.n_embd, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il))

    @staticmethod
    def kq_scale(hp: HParams) -> float:
        return hp.kq_scale

    @staticmethod
    def ffn(g: Graph, x: np.ndarray, L: Layer) -> np.ndarray:
        """The feed-forward of the residual x: LayerNorm, up, GELU, down."""
        cur = g.layer_norm(x, L.ffn_norm, L.ffn_norm_bias)
        cur = g.gelu(g.linear(cur, L.ffn_up, L.ffn_up_bias))                  # [n, n_ff]
        return g.linear(cur, L.ffn_down, L.ffn_down_bias)                     # [n, n_embd]
