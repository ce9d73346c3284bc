"""Qwen3.5 (llama.cpp's ``src/models/qwen35.cpp``): pre-norm blocks whose mixer is a gated
delta-net (linear attention) in three of every four layers and gated attention in the others, each
followed by a post-attention RMS norm and a SwiGLU feed-forward (Qwen3.5-MoE: routed experts and
a sigmoid-gated shared expert).

The delta-net layer projects the input to the convolved Q, K, V, the output gate z, and per value
head a write strength beta and a decay alpha; convolves Q, K, V causally (no bias, then SiLU),
L2-normalizes Q and K per head, runs the recurrence (``src/delta_net.h``), RMS-norms each head's
output and gates it by silu(z). The attention layer's Q projection holds each head's queries and
a gate; Q and K are RMS-normed per head, rotated by interleaved multi-section RoPE (for text, every
section's position is the token's: split-half RoPE), and the output is gated by sigmoid(gate).
The memory is hybrid: a KV cache for the attention layers, a conv state and a delta-net state per
sequence for the others."""

from __future__ import annotations

from typing import Any

from gguflm.errors import ModelLoadError
from gguflm.hparams import HParamReader, HParams, RopeType, read_common_hparams
from gguflm.models.base import Architecture, TensorSpec


class Qwen35(Architecture):
    name = "qwen35"
    rope_type = RopeType.NEOX
    memory = "hybrid"

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = read_common_hparams(kv, n_vocab, cls.rope_type)
        if hp.n_embd_head_k != hp.n_embd_head_v:
            raise ModelLoadError(f"{kv.source}: key_length {hp.n_embd_head_k} != value_length {hp.n_embd_head_v}")
        gdn = {"d_conv": kv.positive("ssm.conv_kernel", kv.get_int("{arch}.ssm.conv_kernel")),
               "d_inner": kv.positive("ssm.inner_size", kv.get_int("{arch}.ssm.inner_size")),
               "d_state": kv.positive("ssm.state_size", kv.get_int("{arch}.ssm.state_size")),
               "n_v_heads": kv.positive("ssm.time_step_rank", kv.get_int("{arch}.ssm.time_step_rank")),
               "n_k_heads": kv.positive("ssm.group_count", kv.get_int("{arch}.ssm.group_count"))}
        if gdn["d_inner"] != gdn["d_state"] * gdn["n_v_heads"] or gdn["n_v_heads"] % gdn["n_k_heads"]:
            raise ModelLoadError(f"{kv.source}: ssm.inner_size {gdn['d_inner']} must be state_size * time_step_rank "
                                 f"and time_step_rank a multiple of group_count {gdn['n_k_heads']}")
        cls.check_rope_sections(kv, hp)
        recurrent = cls.read_recurrent_layers(kv, hp.n_layer)
        return cls.read_moe(kv, hp.with_changes(recurrent_layers=recurrent, extras=gdn))

    @staticmethod
    def read_recurrent_layers(kv: HParamReader, n_layer: int) -> tuple[bool, ...]:
        """``attention.recurrent_layers`` (one flag per layer), else every layer but each
        ``full_attention_interval``-th (default 4)."""
        flags = kv.get_ints("{arch}.attention.recurrent_layers", ())
        if flags:
            if len(flags) != n_layer:
                raise ModelLoadError(f"{kv.source}: attention.recurrent_layers has {len(flags)} values for {n_layer} layers")
            return tuple(bool(f) for f in flags)
        interval = kv.positive("full_attention_interval", kv.get_int("{arch}.full_attention_interval", 4))
        return tuple((il + 1) % interval != 0 for il in range(n_layer))

    @staticmethod
    def check_rope_sections(kv: HParamReader, hp: HParams) -> None:
        """Interleaved multi-section RoPE is split-half RoPE for text when every rotated pair takes
        one of the first three sections' positions (the fourth's is 0)."""
        sections = list(kv.get_ints("{arch}.rope.dimension_sections", (0, 0, 0, 0))[:4])
        sections += [0] * (4 - len(sections))
        n_dims = sum(sections)
        if n_dims == 0 or any(not (s % 3 == 0 and s < 3 * sections[0] or s % 3 == 1 and s < 3 * sections[1]
                                   or s % 3 == 2 and s < 3 * sections[2])
                              for s in ((i % n_dims) for i in range(hp.n_rot // 2))):
            raise ModelLoadError(f"{kv.source}: rope.dimension_sections {sections} leave rotated pairs on the "
                                 f"fourth section: not supported")

    @classmethod
    def read_moe(cls, kv: HParamReader, hp: HParams) -> HParams:
        """Qwen3.5's feed-forwards are dense."""
        return hp

    @classmethod
    def state_sizes(cls, hp: HParams) -> tuple[int, int]:
        gdn = hp.extras
        conv_dim = gdn["d_inner"] + 2 * gdn["n_k_heads"] * gdn["d_state"]
        return (gdn["d_conv"] - 1) * conv_dim, gdn["d_state"] * gdn["d_inner"]

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        gdn, e = hp.extras, hp.n_embd
        key_dim, value_dim = gdn["d_state"] * gdn["n_k_heads"], gdn["d_inner"]
        conv_dim = 2 * key_dim + value_dim
        hd = hp.n_embd_head_k
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk, n_q = f"blk.{il}", hp.n_head[il] * hd
            specs += [TensorSpec(f"{blk}.attn_norm.weight", (e,)), TensorSpec(f"{blk}.post_attention_norm.weight", (e,))]
            if hp.is_recurrent(il):
                specs += [
                    TensorSpec(f"{blk}.attn_qkv.weight", (e, conv_dim)),
                    TensorSpec(f"{blk}.attn_gate.weight", (e, value_dim)),
                    TensorSpec(f"{blk}.ssm_conv1d.weight", (gdn["d_conv"], conv_dim)),
                    TensorSpec(f"{blk}.ssm_dt.bias", (gdn["n_v_heads"],)),
                    TensorSpec(f"{blk}.ssm_a", (gdn["n_v_heads"],)),
                    TensorSpec(f"{blk}.ssm_beta.weight", (e, gdn["n_v_heads"])),
                    TensorSpec(f"{blk}.ssm_alpha.weight", (e, gdn["n_v_heads"])),
                    TensorSpec(f"{blk}.ssm_norm.weight", (gdn["d_state"],)),
                    TensorSpec(f"{blk}.ssm_out.weight", (value_dim, e)),
                ]
            else:
                specs += [
                    TensorSpec(f"{blk}.attn_q.weight", (e, 2 * n_q)),
                    TensorSpec(f"{blk}.attn_k.weight", (e, hp.n_embd_k_gqa(il))),
                    TensorSpec(f"{blk}.attn_v.weight", (e, hp.n_embd_v_gqa(il))),
                    TensorSpec(f"{blk}.attn_output.weight", (n_q, e)),
                    TensorSpec(f"{blk}.attn_q_norm.weight", (hd,)),
                    TensorSpec(f"{blk}.attn_k_norm.weight", (hd,)),
                ]
            specs += cls.feed_forward_specs(hp, il)
        return specs

    @classmethod
    def feed_forward_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        return cls.ffn_specs(hp, il)

    def forward(self, g: Any) -> tuple[Any, Any]:
        hp, tensors = g.hparams, g.model.tensors
        g.recurrent_moves()
        x = g.embed(tensors["token_embd.weight"])                     # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = g.rms_norm(x, L.attn_norm)
            cur = self.delta_net(g, il, cur, L) if hp.is_recurrent(il) else self.gated_attention(g, il, cur, L)
            g.add(x, cur)
            cur = g.rms_norm(x, L.post_attention_norm)
            g.add(x, self.feed_forward(g, cur, L))
        # the rows that produce output are taken after the final norm (llama.cpp's order here)
        (x,) = g.output_rows(g.rms_norm(x, tensors["output_norm.weight"]))
        return x, g.logits(x, tensors["output.weight"])

    def feed_forward(self, g: Any, cur: Any, L: Any) -> Any:
        gate, up = g.project(cur, L.ffn_gate, L.ffn_up)                 # [n, n_ff]
        (out,) = g.project(g.swiglu(gate, up), L.ffn_down)              # [n, n_embd]
        return out

    @staticmethod
    def gated_attention(g: Any, il: int, cur: Any, L: Any) -> Any:
        """Attention over Q/K-normed, rotated heads, its output gated by sigmoid(gate)."""
        hp = g.hparams
        n, hd, n_head = cur.shape[0], hp.n_embd_head_k, hp.n_head[il]
        q_gate, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)     # [n, n_head * 2 * hd]: per head q, gate
        heads = q_gate.reshape(n * n_head, 2 * hd)
        q = g.rms_norm(heads[:, :hd], L.attn_q_norm).reshape(n, n_head * hd)
        g.rope_qk(q, k, il, None, L.attn_k_norm)
        out = g.attention(il, q, k, v, hp.kq_scale)                     # [n, n_head * hd]
        g.sigmoid_mul(out.reshape(n * n_head, hd), heads[:, hd:])
        (out,) = g.project(out, L.attn_output)
        return out

    def delta_net(self, g: Any, il: int, cur: Any, L: Any) -> Any:
        """The gated delta-net layer: conv, L2-normed Q and K, the recurrence, a gated RMS norm."""
        gdn = g.hparams.extras
        d, key_dim = gdn["d_state"], gdn["d_state"] * gdn["n_k_heads"]
        n = cur.shape[0]
        qkv, z, beta, alpha = self.projections(g, cur, L)               # [n, conv_dim], [n, d_inner], [n, n_v_heads] x 2
        g.gdn_gates(alpha, L.ssm_dt_bias, L.ssm_a, beta)                # alpha: log-decays, beta: strengths
        conv = g.short_conv(il, qkv, L.ssm_conv1d, silu=True)           # [n, conv_dim]
        q, k, v = g.split(conv, key_dim, key_dim, conv.shape[1] - 2 * key_dim)
        q, k = self.key_heads(g, g.l2_norm_heads(q, d), g.l2_norm_heads(k, d))
        out = g.gated_delta_net(il, q, k, v, alpha, beta)               # [n, d_inner]
        normed = g.rms_norm(out.reshape(-1, d), L.ssm_norm).reshape(n, -1)
        return g.project_by_seq(g.swiglu(z, normed), L.ssm_out)         # silu(z) * norm(out)

    @staticmethod
    def projections(g: Any, cur: Any, L: Any) -> tuple[Any, ...]:
        """The convolution's input (Q, K, V), the output gate z, beta and alpha."""
        return g.project(cur, L.attn_qkv, L.attn_gate, L.ssm_beta, L.ssm_alpha)

    @staticmethod
    def key_heads(g: Any, q: Any, k: Any) -> tuple[Any, Any]:
        """Q and K as the recurrence reads them: the fused op shares key heads tiled."""
        return q, k
