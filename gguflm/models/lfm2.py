"""LFM2 (Liquid): RMSNorm blocks whose mixer is either attention or a gated short convolution
(llama.cpp's ``src/models/lfm2.cpp``), then a SwiGLU feed-forward (LFM2-MoE: a mixture of SwiGLU
experts after its leading dense blocks). Attention layers (those with KV heads) RMS-norm Q and K
per head before split-half RoPE; a short-convolution layer projects the input to gates b, c and
values x, convolves b * x causally over the sequence's last ``shortconv.l_cache`` inputs (no bias,
no activation) and gates the result by c. The memory is hybrid: a KV cache for the attention
layers, a conv state per sequence for the others."""

from __future__ import annotations

from typing import Any

from gguflm.errors import ModelLoadError
from gguflm.hparams import HParamReader, HParams, RopeType, read_common_hparams, read_expert_hparams
from gguflm.models.base import Architecture, TensorSpec


class Lfm2(Architecture):
    name = "lfm2"
    rope_type = RopeType.NEOX
    memory = "hybrid"
    # the output norm is stored under the token embedding's name (llama.cpp's OUTPUT_NORM_LFM2)
    output_norm = "token_embd_norm.weight"

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = read_common_hparams(kv, n_vocab, cls.rope_type, headless_layers=True)
        l_cache = kv.get_int("{arch}.shortconv.l_cache")
        if l_cache < 2:
            raise ModelLoadError(f"{kv.source}: shortconv.l_cache {l_cache} must be at least 2")
        if kv.get_int("{arch}.attention.sliding_window", 0):
            raise ModelLoadError(f"{kv.source}: LFM2 with a sliding window is not supported")
        recurrent = tuple(h == 0 for h in hp.n_head_kv)
        return cls.read_moe(kv, hp.with_changes(recurrent_layers=recurrent, extras={"l_cache": l_cache}))

    @classmethod
    def read_moe(cls, kv: HParamReader, hp: HParams) -> HParams:
        """LFM2's blocks are all dense."""
        return hp.with_changes(n_layer_dense_lead=hp.n_layer)

    @classmethod
    def state_sizes(cls, hp: HParams) -> tuple[int, int]:
        return hp.n_embd * (hp.extras["l_cache"] - 1), 0

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e = hp.n_embd
        specs = [TensorSpec("token_embd.weight", (e, hp.n_vocab)), TensorSpec(cls.output_norm, (e,)),
                 TensorSpec("output.weight", (e, hp.n_vocab), optional=True, fallback="token_embd.weight")]
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += [TensorSpec(f"{blk}.attn_norm.weight", (e,)), TensorSpec(f"{blk}.ffn_norm.weight", (e,))]
            if hp.is_recurrent(il):
                specs += [
                    TensorSpec(f"{blk}.shortconv.conv.weight", (hp.extras["l_cache"], e), field="shortconv_conv"),
                    TensorSpec(f"{blk}.shortconv.in_proj.weight", (e, 3 * e), field="shortconv_in_proj"),
                    TensorSpec(f"{blk}.shortconv.out_proj.weight", (e, e), field="shortconv_out_proj"),
                ]
            else:
                specs += cls.attention_specs(hp, il)
                specs += [TensorSpec(f"{blk}.attn_q_norm.weight", (hp.n_embd_head_k,)),
                          TensorSpec(f"{blk}.attn_k_norm.weight", (hp.n_embd_head_k,))]
            if il < hp.n_layer_dense_lead:
                specs += cls.ffn_specs(hp, il)
            else:
                specs += cls.expert_specs(hp, il) + [TensorSpec(f"{blk}.exp_probs_b.bias", (hp.n_expert,))]
        return specs

    def forward(self, g: Any) -> tuple[Any, Any]:
        hp, tensors = g.hparams, g.model.tensors
        g.recurrent_moves()
        x = g.embed(tensors["token_embd.weight"])                     # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = g.rms_norm(x, L.attn_norm)
            cur = self.short_conv(g, il, cur, L) if hp.is_recurrent(il) else self.attention(g, il, cur, L)
            if il == hp.n_layer - 1:
                cur, x = g.output_rows(cur, x)
            g.add(x, cur)
            cur = g.rms_norm(x, L.ffn_norm)
            if il < hp.n_layer_dense_lead:
                gate, up = g.project(cur, L.ffn_gate, L.ffn_up)         # [n, n_ff]
                (cur,) = g.project(g.swiglu(gate, up), L.ffn_down)      # [n, n_embd]
            else:
                cur = g.moe_ffn(cur, L, norm_w=True, gating=hp.expert_gating_func,
                                w_scale=hp.expert_weights_scale, selection_bias=L.exp_probs_b_bias)
            g.add(x, cur)
        x = g.rms_norm(x, tensors[self.output_norm])
        return x, g.logits(x, tensors["output.weight"])

    @staticmethod
    def attention(g: Any, il: int, cur: Any, L: Any) -> Any:
        """Q/K-normed attention with split-half RoPE."""
        q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)          # [n, n_head(_kv) * head_dim]
        g.rope_qk(q, k, il, L.attn_q_norm, L.attn_k_norm)
        return g.linear(g.attention(il, q, k, v, g.hparams.kq_scale), L.attn_output)

    @staticmethod
    def short_conv(g: Any, il: int, cur: Any, L: Any) -> Any:
        """y = out_proj(c * conv(b * x)), the conv state moved on."""
        e = g.hparams.n_embd
        bcx = g.project_by_seq(cur, L.shortconv_in_proj)                # [n, 3 * n_embd]: b, c, x
        b, c, xv = bcx[:, :e], bcx[:, e:2 * e], bcx[:, 2 * e:]
        y = g.short_conv(il, g.mul(b, xv), L.shortconv_conv)            # [n, n_embd]
        return g.project_by_seq(g.mul(y, c), L.shortconv_out_proj)


class Lfm2Moe(Lfm2):
    name = "lfm2moe"

    @classmethod
    def read_moe(cls, kv: HParamReader, hp: HParams) -> HParams:
        """The leading dense blocks, then experts with a selection bias, gated as the file says."""
        hp = read_expert_hparams(kv, hp)
        return hp.with_changes(n_layer_dense_lead=kv.get_int("{arch}.leading_dense_block_count", 0),
                               expert_gating_func=kv.get_int("{arch}.expert_gating_func"))
