"""Granite 4 hybrid (Granite-4.0-H): Mamba-2 layers (``head_count_kv`` 0) interleaved with attention
layers, each followed by Granite's feed-forward (llama.cpp's ``src/models/granite-hybrid.cpp``).
Granite's scales, each optional here: the token embeddings, every mixer and feed-forward output
before it joins the residual stream, the attention scores, and the logits (divided by
``logit_scale``); ``rope.scaling.finetuned`` false turns RoPE off. With ``expert_count`` the
feed-forward is a mixture of SwiGLU experts (normalised softmax routing), with
``expert_shared_feed_forward_length`` plus a shared expert. The memory is hybrid: a KV cache for
the attention layers, a conv and an SSM state per sequence for the Mamba-2 ones."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.granite import Granite
from gguflm.models.hybrid import read_hybrid_hparams, require_attention
from gguflm.models.mamba import Mamba
from gguflm.models.mamba2 import Mamba2


class GraniteHybrid(Granite):
    name = "granitehybrid"
    memory = "hybrid"

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = read_hybrid_hparams(kv, n_vocab, cls.rope_type)
        Mamba.require_expansion_2(kv, hp)
        require_attention(kv, hp, cls.attention_layers(hp))
        logit_scale = np.float32(kv.get_float("{arch}.logit_scale", 0.0))
        rope = kv.get_bool("{arch}.rope.scaling.finetuned", True)
        hp = hp.with_changes(
            f_logit_scale=float(np.float32(1) / logit_scale) if logit_scale else 0.0,
            f_residual_scale=kv.get_float("{arch}.residual_scale", 0.0),
            f_embedding_scale=kv.get_float("{arch}.embedding_scale", 0.0),
            f_attention_scale=kv.get_float("{arch}.attention.scale", 0.0),
            rope_type=hp.rope_type if rope else RopeType.NONE,
        )
        hp = cls.read_experts(kv, hp)
        if any(n <= 0 for n in hp.n_ff):
            raise HParamError(f"{kv.source}: every Granite 4 layer has a feed-forward, found feed_forward_length "
                              f"{list(hp.n_ff)}")
        return hp

    state_sizes = Mamba2.state_sizes

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        specs.append(TensorSpec("rope_freqs.weight", (hp.n_rot // 2,), optional=True))
        for il in range(hp.n_layer):
            specs.append(TensorSpec(f"blk.{il}.attn_norm.weight", (hp.n_embd,)))
            if hp.is_recurrent(il):
                specs += Mamba2.ssm_specs(hp, il)
            else:
                specs += cls.attention_specs(hp, il, bias=None)
            specs.append(TensorSpec(f"blk.{il}.ffn_norm.weight", (hp.n_embd,)))
            if cls.has_experts(hp, il):
                specs += cls.ffn_or_expert_specs(hp, il)
            else:
                specs += cls.ffn_specs(hp, il, biases=True)
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        g.recurrent_moves()
        x = g.embed(m.tensors["token_embd.weight"], scale=hp.f_embedding_scale)  # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = g.rms_norm(x, L.attn_norm)
            if hp.is_recurrent(il):
                cur = Mamba2.mixer(g, il, L, cur)                                # [n_tokens, n_embd]
            else:
                cur = self.attention(g, il, L, cur)                              # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                                   # [n_outputs, n_embd]
            g.add(x, self.residual(g, cur))
            self.feed_forward(g, L, x)
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                       # [n_outputs, n_vocab]

    def attention(self, g: Graph, il: int, L, cur: np.ndarray) -> np.ndarray:
        """Self-attention of layer ``il`` (Q/K/V and output biases where the file has them)."""
        q, k, v = self.qkv(g, cur, L)                                           # [n_tokens, n_head(_kv) * head_dim]
        g.rope_qk(q, k, il)
        cur = g.attention(il, q, k, v, g.hparams.kq_scale)                      # [n_tokens, n_head * head_dim]
        return g.linear(cur, L.attn_output, L.attn_output_bias)

    def feed_forward(self, g: Graph, L, x: np.ndarray) -> None:
        """x += the scaled feed-forward (dense SwiGLU with its optional biases, or the experts)
        of the normed x."""
        cur = g.rms_norm(x, L.ffn_norm)
        if self.has_experts(g.hparams, L.index):
            cur = self.experts(g, cur, L)                                       # [n, n_embd]
        else:
            gate, up = g.project(cur, L.ffn_gate, L.ffn_up)                     # [n, n_ff]
            g.add_bias(gate, L.ffn_gate_bias)
            g.add_bias(up, L.ffn_up_bias)
            cur = g.linear(g.swiglu(gate, up), L.ffn_down, L.ffn_down_bias)     # [n, n_embd]
        g.add(x, self.residual(g, cur))
