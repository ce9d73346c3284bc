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
        return hp.with_changes(extras=cls.read_ssm2_keys(kv, hp.extras))

    @staticmethod
    def read_ssm2_keys(kv: HParamReader, ssm: dict) -> dict:
        """Mamba-2's ``ssm.group_count`` added to the ``ssm.*`` keys, the sizes checked."""
        ssm = dict(ssm, n_group=kv.positive("ssm.group_count", kv.get_int("{arch}.ssm.group_count")))
        n_head = ssm["dt_rank"]   # Mamba-2's time_step_rank is its number of heads
        if ssm["d_inner"] % n_head or n_head % ssm["n_group"]:
            raise ModelLoadError(f"{kv.source}: ssm.inner_size {ssm['d_inner']} must be a multiple of "
                                 f"time_step_rank {n_head}, itself a multiple of group_count {ssm['n_group']}")
        return ssm

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
    def ssm_specs(cls, hp: HParams, il: int, *, optional_norm: bool = False) -> list[TensorSpec]:
        """The Mamba-2 block of layer ``il``; ``optional_norm``: its grouped norm may be absent
        (Falcon-H1's)."""
        ssm = hp.extras
        e, d_inner, n_head, n_group = hp.n_embd, ssm["d_inner"], ssm["dt_rank"], ssm["n_group"]
        conv_dim = cls.conv_dim(hp)
        blk = f"blk.{il}"
        return [
            TensorSpec(f"{blk}.ssm_in.weight", (e, d_inner + conv_dim + n_head)),
            TensorSpec(f"{blk}.ssm_conv1d.weight", (ssm["d_conv"], conv_dim)),
            TensorSpec(f"{blk}.ssm_conv1d.bias", (conv_dim,)),
            TensorSpec(f"{blk}.ssm_dt.bias", (n_head,)),
            TensorSpec(f"{blk}.ssm_a", (1, n_head)),
            TensorSpec(f"{blk}.ssm_d", (1, n_head)),
            TensorSpec(f"{blk}.ssm_norm.weight", (d_inner // n_group, n_group), optional=optional_norm),
            TensorSpec(f"{blk}.ssm_out.weight", (d_inner, e)),
        ]

    @classmethod
    def mixer(cls, g: Any, il: int, L: Any, cur: Any) -> Any:
        """Mamba-2's block of layer ``il`` on the normed input ``cur`` (llama.cpp's
        build_mamba2_layer): [n_tokens, n_embd] -> [n_tokens, n_embd]."""
        ssm = g.hparams.extras
        d_inner, d_state, n_group = ssm["d_inner"], ssm["d_state"], ssm["n_group"]
        conv_dim = cls.conv_dim(g.hparams)
        (zxbcdt,) = g.project(cur, L.ssm_in)                           # [n_tokens, z | x B C | dt]
        z, dt = zxbcdt[:, :d_inner], zxbcdt[:, d_inner + conv_dim:]
        xbc = g.ssm_conv(il, zxbcdt[:, d_inner:d_inner + conv_dim], L.ssm_conv1d, L.ssm_conv1d_bias)
        B = xbc[:, d_inner:d_inner + n_group * d_state]
        C = xbc[:, d_inner + n_group * d_state:]
        y = g.ssm_scan_grouped(il, xbc[:, :d_inner], dt, L.ssm_dt_bias, L.ssm_a, B, C, L.ssm_d, n_group)
        y = g.swiglu(z, y)                                             # silu(z) * y
        if L.ssm_norm is not None:
            y = g.rms_norm_groups(y, L.ssm_norm, d_inner // n_group)
        (out,) = g.project(y, L.ssm_out)                               # [n_tokens, n_embd]
        return out
