"""Mamba-2: RMSNorm, then Mamba-2's state-space block (llama.cpp's ``build_mamba2_layer``): one input
projection to the gate z, the convolved x, B and C, and dt; a causal convolution over x, B and C;
the selective scan with one decay per head and B, C shared by groups of heads; ``y * silu(z)``
RMS-normed per group; the output projection. The memory is recurrent, as Mamba's."""

from __future__ import annotations

from typing import Any

from gguflm.errors import ModelLoadError
from gguflm.hparams import HParamReader, HParams
from gguflm.models.base import TensorSpec
from gguflm.models.mamba import Mamba


class Mamba2(Mamba):
    name = "mamba2"

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_ssm_hparams(kv, n_vocab)
        ssm = dict(hp.extras, n_group=kv.positive("ssm.group_count", kv.get_int("{arch}.ssm.group_count")))
        n_head = ssm["dt_rank"]   # Mamba-2's time_step_rank is its number of heads
        if ssm["d_inner"] % n_head or n_head % ssm["n_group"]:
            raise ModelLoadError(f"{kv.source}: ssm.inner_size {ssm['d_inner']} must be a multiple of "
                                 f"time_step_rank {n_head}, itself a multiple of group_count {ssm['n_group']}")
        return hp.with_changes(extras=ssm)

    @classmethod
    def state_sizes(cls, hp: HParams) -> tuple[int, int]:
        ssm = hp.extras
        return (ssm["d_conv"] - 1) * cls.conv_dim(hp), ssm["d_state"] * ssm["d_inner"]

    @staticmethod
    def conv_dim(hp: HParams) -> int:
        """Channels of the convolution: x, then B and C of every group."""
        ssm = hp.extras
        return ssm["d_inner"] + 2 * ssm["n_group"] * ssm["d_state"]

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        ssm = hp.extras
        e, d_inner, n_head, n_group = hp.n_embd, ssm["d_inner"], ssm["dt_rank"], ssm["n_group"]
        conv_dim = cls.conv_dim(hp)
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs += [
                TensorSpec(f"{blk}.attn_norm.weight", (e,)),
                TensorSpec(f"{blk}.ssm_in.weight", (e, d_inner + conv_dim + n_head)),
                TensorSpec(f"{blk}.ssm_conv1d.weight", (ssm["d_conv"], conv_dim)),
                TensorSpec(f"{blk}.ssm_conv1d.bias", (conv_dim,)),
                TensorSpec(f"{blk}.ssm_dt.bias", (n_head,)),
                TensorSpec(f"{blk}.ssm_a", (1, n_head)),
                TensorSpec(f"{blk}.ssm_d", (1, n_head)),
                TensorSpec(f"{blk}.ssm_norm.weight", (d_inner // n_group, n_group)),
                TensorSpec(f"{blk}.ssm_out.weight", (d_inner, e)),
            ]
        return specs

    def forward(self, g: Any) -> tuple[Any, Any]:
        hp, tensors = g.hparams, g.model.tensors
        ssm = hp.extras
        d_inner, d_state, n_group, n_head = ssm["d_inner"], ssm["d_state"], ssm["n_group"], ssm["dt_rank"]
        conv_dim = self.conv_dim(hp)
        g.recurrent_moves()
        x = g.embed(tensors["token_embd.weight"])                     # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = g.rms_norm(x, L.attn_norm)
            (zxbcdt,) = g.project(cur, L.ssm_in)                       # [n_tokens, z | x B C | dt]
            z, dt = zxbcdt[:, :d_inner], zxbcdt[:, d_inner + conv_dim:]
            xbc = g.ssm_conv(il, zxbcdt[:, d_inner:d_inner + conv_dim], L.ssm_conv1d, L.ssm_conv1d_bias)
            B = xbc[:, d_inner:d_inner + n_group * d_state]
            C = xbc[:, d_inner + n_group * d_state:]
            y = g.ssm_scan_grouped(il, xbc[:, :d_inner], dt, L.ssm_dt_bias, L.ssm_a, B, C, L.ssm_d, n_group)
            y = g.swiglu(z, y)                                         # silu(z) * y
            y = g.rms_norm_groups(y, L.ssm_norm, d_inner // n_group)
            (cur,) = g.project(y, L.ssm_out)                           # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                cur, x = g.output_rows(cur, x)
            g.add(cur, x)
            x = cur
        x = g.rms_norm(x, tensors["output_norm.weight"])
        return x, g.logits(x, tensors["output.weight"])
