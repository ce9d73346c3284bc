"""ModernBERT, granite-embedding R2 and gte-reranker-modernbert: a pre-norm encoder. LayerNorms
without biases (the first layer's attention norm may be absent: identity), a fused QKV
projection, split-half RoPE, symmetric sliding windows on all but every third layer
(their own RoPE base), a GeGLU feed-forward over one up projection's halves (SwiGLU or ReGLU where
``hidden_activation`` says so), and a rank head that mean-pools unless the file says otherwise,
then dense, GELU and a LayerNorm."""

from __future__ import annotations

import numpy as np

from gguflm.graph import GLU_GEGLU, GLU_REGLU, GLU_SWIGLU, Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType, read_swa_layers, rsqrt_f32
from gguflm.models.base import TensorSpec
from gguflm.models.bert import Bert
from gguflm.pooling import PoolingType

# llama.cpp's LLM_FFN_OP_TYPES_FROM_STRING, the gated kinds its graph runs over a fused up
# projection; "relu" maps to ungated ReLU there, which leaves a feed-forward of the wrong width
GATED_ACTIVATIONS = {"gelu": GLU_GEGLU, "geglu": GLU_GEGLU, "silu": GLU_SWIGLU, "swish": GLU_SWIGLU,
                     "swiglu": GLU_SWIGLU, "reglu": GLU_REGLU}


class ModernBert(Bert):
    name = "modern-bert"
    rope_type = RopeType.NEOX
    rotary = True
    requires_token_type_count = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        act = kv.metadata.get(kv.key("{arch}.hidden_activation"), "geglu")
        if act not in GATED_ACTIVATIONS:
            raise HParamError(f"{kv.source}: {kv.key('{arch}.hidden_activation')} {act!r} is not supported "
                              f"(one of {', '.join(GATED_ACTIVATIONS)})")
        n_swa = kv.get_int("{arch}.attention.sliding_window", 0)
        if n_swa > 0:
            hp = hp.with_changes(
                n_swa=n_swa, swa_symmetric=True, swa_layers=read_swa_layers(kv, hp.n_layer, 3, dense_first=True),
                rope_freq_base_train_swa=kv.get_float("{arch}.rope.freq_base_swa", hp.rope_freq_base_train_swa))
        pooling_cls = hp.pooling_type_cls
        if pooling_cls == PoolingType.UNSPECIFIED:
            pooling_cls = PoolingType.MEAN
        return hp.with_changes(pooling_type_cls=pooling_cls, extras={**hp.extras, "glu": GATED_ACTIVATIONS[act]})

    @classmethod
    def max_positions(cls, hp: HParams) -> int | None:
        return None

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e = hp.n_embd
        specs = [TensorSpec("token_embd.weight", (e, hp.n_vocab)), TensorSpec("token_embd_norm.weight", (e,)),
                 TensorSpec("output_norm.weight", (e,))]
        for il in range(hp.n_layer):
            blk, f = f"blk.{il}", hp.n_ff[il]
            specs += [TensorSpec(f"{blk}.attn_norm.weight", (e,), optional=il == 0),
                      TensorSpec(f"{blk}.attn_qkv.weight", (e, 3 * e)),
                      TensorSpec(f"{blk}.attn_output.weight", (e, e)),
                      TensorSpec(f"{blk}.ffn_up.weight", (e, 2 * f)),
                      TensorSpec(f"{blk}.ffn_down.weight", (f, e)),
                      TensorSpec(f"{blk}.ffn_norm.weight", (e,))]
        # llama.cpp declares no bias for the head's dense layer
        return specs + [s for s in cls.classifier_specs(hp) if s.name != "cls.bias"] + [
            TensorSpec("cls.norm.weight", (e,), optional=True)]

    @staticmethod
    def classifier_hidden(g: Graph, x: np.ndarray) -> np.ndarray:
        """GELU, then the head's LayerNorm where the file has one."""
        return g.layer_norm(g.gelu(x), g.model.tensors.get("cls.norm.weight"), None)

    def forward(self, g: Graph) -> tuple[np.ndarray, None]:
        hp, t = g.hparams, g.model.tensors
        kq_scale = rsqrt_f32(hp.n_embd_head_k)
        x = g.layer_norm(g.embed(t["token_embd.weight"]), t["token_embd_norm.weight"], None)   # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = x if L.attn_norm is None else g.layer_norm(x, L.attn_norm, None)
            (qkv,) = g.project(cur, L.attn_qkv)
            q, k, v = g.split(qkv, hp.n_embd, hp.n_embd, hp.n_embd)           # [n_tokens, n_embd] each
            g.rope(q, il, hp.n_head[il])
            g.rope(k, il, hp.n_head_kv[il])
            (cur,) = g.project(g.attention(il, q, k, v, kq_scale), L.attn_output)
            if il == hp.n_layer - 1:
                cur, x = g.output_rows(cur, x)                                # [n_outputs, n_embd]
            ffn_inp = g.add(cur, x)
            (gate_up,) = g.project(g.layer_norm(ffn_inp, L.ffn_norm, None), L.ffn_up)   # [n, 2 * n_ff]
            gate, up = g.split(gate_up, hp.n_ff[il], hp.n_ff[il])
            (cur,) = g.project(g.glu(hp.extras["glu"], gate, up), L.ffn_down)
            x = g.add(cur, ffn_inp)
        return g.layer_norm(x, t["output_norm.weight"], None), None
