"""Mamba (Mamba-1, FalconMamba): RMSNorm, then a selective state-space block instead of attention
and feed-forward (llama.cpp's ``src/models/mamba.cpp`` and ``build_mamba_layer``): an input
projection to x and the gate z, a causal convolution of x over the sequence's last ``d_conv``
inputs, the selective scan over its state, ``y * silu(z)``, the output projection; FalconMamba
(``ssm.dt_b_c_rms``) RMS-normalises dt, B and C. The memory is recurrent: a conv state and an
SSM state per sequence and layer (:mod:`gguflm.memory_recurrent`)."""

from __future__ import annotations

from typing import Any

from gguflm.errors import ModelLoadError
from gguflm.hparams import HParamReader, HParams, RopeType
from gguflm.models.base import Architecture, TensorSpec


class Mamba(Architecture):
    name = "mamba"
    rope_type = RopeType.NONE
    memory = "recurrent"

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_ssm_hparams(kv, n_vocab)
        if hp.extras["d_inner"] != 2 * hp.n_embd:   # as llama.cpp, which supports no other expansion
            raise ModelLoadError(f"{kv.source}: ssm.inner_size {hp.extras['d_inner']} is not 2 * embedding_length "
                                 f"({hp.n_embd}): only an expansion factor of 2 is supported")
        return hp

    @classmethod
    def read_ssm_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        """The keys of every Mamba: the common ones (no attention, no feed-forward) and ``ssm.*``."""
        n_layer = kv.positive("block_count", kv.get_int("{arch}.block_count"))
        n_embd = kv.positive("embedding_length", kv.get_int("{arch}.embedding_length"))
        ssm = {"d_conv": kv.positive("ssm.conv_kernel", kv.get_int("{arch}.ssm.conv_kernel")),
               "d_inner": kv.positive("ssm.inner_size", kv.get_int("{arch}.ssm.inner_size")),
               "d_state": kv.positive("ssm.state_size", kv.get_int("{arch}.ssm.state_size")),
               "dt_rank": kv.positive("ssm.time_step_rank", kv.get_int("{arch}.ssm.time_step_rank")),
               "dt_b_c_rms": kv.get_bool("{arch}.ssm.dt_b_c_rms", False)}
        zeros = (0,) * n_layer   # no attention heads, no feed-forward
        return HParams(arch=kv.arch, n_vocab=n_vocab, n_ctx_train=kv.get_int("{arch}.context_length"),
                       n_embd=n_embd, n_layer=n_layer, n_ff=zeros, n_head=zeros, n_head_kv=zeros,
                       n_embd_head_k=0, n_embd_head_v=0, n_rot=0,
                       f_norm_rms_eps=kv.get_float("{arch}.attention.layer_norm_rms_epsilon"),
                       rope_type=cls.rope_type, recurrent_layers=(True,) * n_layer, extras=ssm)

    @classmethod
    def state_sizes(cls, hp: HParams) -> tuple[int, int]:
        ssm = hp.extras
        return (ssm["d_conv"] - 1) * ssm["d_inner"], ssm["d_state"] * ssm["d_inner"]

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        ssm = hp.extras
        e, d_inner, d_state, dt_rank = hp.n_embd, ssm["d_inner"], ssm["d_state"], ssm["dt_rank"]
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += [
                TensorSpec(f"{blk}.attn_norm.weight", (e,)),
                TensorSpec(f"{blk}.ssm_in.weight", (e, 2 * d_inner)),
                TensorSpec(f"{blk}.ssm_conv1d.weight", (ssm["d_conv"], d_inner)),
                TensorSpec(f"{blk}.ssm_conv1d.bias", (d_inner,)),
                TensorSpec(f"{blk}.ssm_x.weight", (d_inner, dt_rank + 2 * d_state)),
                TensorSpec(f"{blk}.ssm_dt.weight", (dt_rank, d_inner)),
                TensorSpec(f"{blk}.ssm_dt.bias", (d_inner,)),
                TensorSpec(f"{blk}.ssm_a", (d_state, d_inner)),
                TensorSpec(f"{blk}.ssm_d", (d_inner,)),
                TensorSpec(f"{blk}.ssm_out.weight", (d_inner, e)),
            ]
        return specs

    def forward(self, g: Any) -> tuple[Any, Any]:
        hp, tensors = g.hparams, g.model.tensors
        ssm = hp.extras
        d_inner, d_state, dt_rank = ssm["d_inner"], ssm["d_state"], ssm["dt_rank"]
        g.recurrent_moves()
        x = g.embed(tensors["token_embd.weight"])                    # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = g.rms_norm(x, L.attn_norm)
            xz = g.project_by_seq(cur, L.ssm_in)                      # [n_tokens, 2 * d_inner]: x, then z
            xc = g.ssm_conv(il, xz[:, :d_inner], L.ssm_conv1d, L.ssm_conv1d_bias)
            xdb = g.project_by_seq(xc, L.ssm_x)                       # [n_tokens, dt_rank + 2 * d_state]
            dt, B, C = xdb[:, :dt_rank], xdb[:, dt_rank:dt_rank + d_state], xdb[:, dt_rank + d_state:]
            if ssm["dt_b_c_rms"]:   # FalconMamba: RMS norms without weights on dt, B and C
                dt, B, C = g.rms_norm(dt, None), g.rms_norm(B, None), g.rms_norm(C, None)
            dt = g.project_by_seq(dt, L.ssm_dt)                       # [n_tokens, d_inner]
            g.add_bias(dt, L.ssm_dt_bias)
            y = g.ssm_scan(il, xc, dt, L.ssm_a, B, C, L.ssm_d)        # y + x * D
            y = g.swiglu(xz[:, d_inner:], y)                          # silu(z) * y
            cur = g.project_by_seq(y, L.ssm_out)                      # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                cur, x = g.output_rows(cur, x)
            g.add(cur, x)
            x = cur
        x = g.rms_norm(x, tensors["output_norm.weight"])
        return x, g.logits(x, tensors["output.weight"])
