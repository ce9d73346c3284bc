"""BERT (sentence-transformers' MiniLM, BGE, ...): an encoder. Token, token-type and absolute
position embeddings, LayerNorm after every residual (post-norm), GELU feed-forward, non-causal
attention within each ubatch (no KV cache).

Its forward pass is llama.cpp's one encoder graph, which nomic-bert (RoPE, SwiGLU) and
jina-bert-v2 (ALiBi, GEGLU) share: they subclass :class:`Bert` and change the parts that differ.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType, rsqrt_f32
from gguflm.models.base import Architecture, TensorSpec


class Bert(Architecture):
    name = "bert"
    rope_type = RopeType.NEOX       # llama.cpp's type for BERT, though it rotates nothing
    kv_cache = False
    # whether Q and K are rotated by their positions (nomic-bert) instead of absolute embeddings
    rotary: ClassVar[bool] = False
    control_vector = False   # llama.cpp's encoder graphs add none
    # whether the file may hold no token-type embedding (llama.cpp: BERT's is optional), and
    # whether it must say how many types there are
    token_types_optional: ClassVar[bool] = True
    requires_token_type_count: ClassVar[bool] = True
    # whether the block declares jina-bert-v2's optional Q/K LayerNorms and second attention norm
    extra_norms: ClassVar[bool] = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        hp = hp.with_changes(f_norm_eps=kv.get_float("{arch}.attention.layer_norm_epsilon"),
                             extras={"n_token_types": cls.token_type_count(kv)})
        if hp.n_embd_head_k != hp.n_embd_head_v:
            raise HParamError(f"{kv.source}: an encoder needs equal K and V head sizes, found "
                              f"{hp.n_embd_head_k} and {hp.n_embd_head_v}")
        return hp

    @classmethod
    def token_type_count(cls, kv: HParamReader) -> int:
        """``tokenizer.ggml.token_type_count``, which llama.cpp requires of BERT and nomic-bert."""
        n = kv.metadata.get("tokenizer.ggml.token_type_count", 0)
        if not n and cls.requires_token_type_count:
            raise HParamError(f"{kv.source}: {kv.arch} model needs to define token type count "
                              f"(tokenizer.ggml.token_type_count)")
        return int(n)

    @classmethod
    def max_positions(cls, hp: HParams) -> int | None:
        return hp.n_ctx_train

    # -- tensors

    @classmethod
    def embedding_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = [TensorSpec("token_embd.weight", (hp.n_embd, hp.n_vocab)),
                 TensorSpec("token_types.weight", (hp.n_embd, hp.extras["n_token_types"]),
                            optional=cls.token_types_optional)]
        if not cls.rotary:
            specs.append(TensorSpec("position_embd.weight", (hp.n_embd, hp.n_ctx_train)))
        specs += [TensorSpec("token_embd_norm.weight", (hp.n_embd,)),
                  TensorSpec("token_embd_norm.bias", (hp.n_embd,))]
        return specs

    @staticmethod
    def qkv_specs(hp: HParams, il: int) -> list[TensorSpec]:
        """Fused QKV (with an optional bias), else separate Q, K, V (llama.cpp's
        create_tensor_qkv), each with an optional bias."""
        blk = f"blk.{il}"
        widths = {"q": hp.n_head[il] * hp.n_embd_head_k, "k": hp.n_embd_k_gqa(il), "v": hp.n_embd_v_gqa(il)}
        n_qkv = sum(widths.values())
        specs = [TensorSpec(f"{blk}.attn_qkv.weight", (hp.n_embd, n_qkv), optional=True),
                 TensorSpec(f"{blk}.attn_qkv.bias", (n_qkv,), optional=True)]
        for part, width in widths.items():
            specs += [TensorSpec(f"{blk}.attn_{part}.weight", (hp.n_embd, width), optional=True),
                      TensorSpec(f"{blk}.attn_{part}.bias", (width,), optional=True)]
        return specs

    @staticmethod
    def norm_specs(name: str, hp: HParams, optional: bool = False) -> list[TensorSpec]:
        return [TensorSpec(f"{name}.weight", (hp.n_embd,), optional=optional),
                TensorSpec(f"{name}.bias", (hp.n_embd,), optional=optional)]

    @classmethod
    def ffn_tensor_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        blk = f"blk.{il}"
        return [TensorSpec(f"{blk}.ffn_up.weight", (hp.n_embd, hp.n_ff[il])),
                TensorSpec(f"{blk}.ffn_up.bias", (hp.n_ff[il],), optional=True),
                TensorSpec(f"{blk}.ffn_down.weight", (hp.n_ff[il], hp.n_embd)),
                TensorSpec(f"{blk}.ffn_down.bias", (hp.n_embd,), optional=True)]

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.embedding_specs(hp) + cls.classifier_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += cls.qkv_specs(hp, il)
            specs += [TensorSpec(f"{blk}.attn_output.weight", (hp.n_embd, hp.n_embd)),
                      TensorSpec(f"{blk}.attn_output.bias", (hp.n_embd,), optional=True)]
            specs += cls.norm_specs(f"{blk}.attn_output_norm", hp)
            specs += cls.ffn_tensor_specs(hp, il)
            specs += cls.norm_specs(f"{blk}.layer_output_norm", hp)
        return specs

    # -- forward pass

    def forward(self, g: Graph) -> tuple[np.ndarray, None]:
        hp, m = g.hparams, g.model
        t = m.tensors
        head = hp.n_embd_head_k
        kq_scale = rsqrt_f32(head)
        # embeddings: token + type 0 ("sentence A": llama.cpp gives every token type 0) + position
        x = g.embed(t["token_embd.weight"])                                   # [n_tokens, n_embd]
        if "token_types.weight" in t:
            g.add_matrix_row(x, t["token_types.weight"], 0)
        if "position_embd.weight" in t:
            g.add(x, g.position_rows(t["position_embd.weight"]))
        x = g.layer_norm(x, t["token_embd_norm.weight"], t["token_embd_norm.bias"])
        for il, L in g.layers():
            # self-attention over the ubatch
            q, k, v = self.qkv(g, L, il, x)                                   # [n_tokens, n_head * head]
            if self.extra_norms and L.attn_q_norm is not None:
                q = g.layer_norm(q, L.attn_q_norm, L.attn_q_norm_bias)
            if self.extra_norms and L.attn_k_norm is not None:
                k = g.layer_norm(k, L.attn_k_norm, L.attn_k_norm_bias)
            if self.rotary:
                g.rope(q, il, hp.n_head[il])
                g.rope(k, il, hp.n_head_kv[il])
            cur = g.attention(il, q, k, v, kq_scale)
            cur = g.linear(cur, L.attn_output, L.attn_output_bias)           # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                cur, x = g.output_rows(cur, x)                                # [n_outputs, n_embd]
            # residual, then LayerNorm (post-norm)
            cur = g.layer_norm(g.add(cur, x), L.attn_output_norm, L.attn_output_norm_bias)
            if self.extra_norms and L.attn_norm_2 is not None:
                cur = g.layer_norm(g.add(cur, x), L.attn_norm_2, L.attn_norm_2_bias)
            ffn_inp = cur
            # feed-forward, residual, LayerNorm
            cur = g.add(self.ffn(g, L, il, cur), ffn_inp)
            x = g.layer_norm(cur, L.layer_output_norm, L.layer_output_norm_bias)
        return x, None

    @staticmethod
    def qkv(g: Graph, L, il: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        hp = g.hparams
        if L.attn_qkv is not None:
            qkv = g.linear(x, L.attn_qkv, L.attn_qkv_bias)
            q, k, v = g.split(qkv, hp.n_head[il] * hp.n_embd_head_k, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il))
        elif L.attn_q is not None and L.attn_k is not None and L.attn_v is not None:
            q, k, v = g.project(x, L.attn_q, L.attn_k, L.attn_v)
        else:
            raise HParamError(f"layer {il} has neither attn_qkv nor all of attn_q, attn_k, attn_v")
        for y, bias in ((q, L.attn_q_bias), (k, L.attn_k_bias), (v, L.attn_v_bias)):
            g.add_bias(y, bias)
        return q, k, v

    def ffn(self, g: Graph, L, il: int, x: np.ndarray) -> np.ndarray:
        """up (+ bias), GELU, down (+ bias)."""
        cur = g.gelu(g.linear(x, L.ffn_up, L.ffn_up_bias))
        return g.linear(cur, L.ffn_down, L.ffn_down_bias)
