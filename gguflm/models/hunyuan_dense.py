"""Hunyuan dense (hunyuan-dense: Hunyuan-0.5B..7B-Instruct): Llama's block with split-half RoPE
over the whole head, then per-head Q/K RMS norms (after RoPE, unlike Qwen 3's), optional Q/K/V
biases; ``rope.scaling.alpha`` raises the RoPE base to base * alpha^(d / (d - 2)) (NTK-aware
scaling), as llama.cpp's loader does."""

from __future__ import annotations

import numpy as np

from gguflm.hparams import HParamError, HParamReader, HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama
from gguflm.rope import powf


class HunyuanDense(Llama):
    name = "hunyuan-dense"
    rope_type = RopeType.NEOX
    qk_norm = True
    qk_norm_after_rope = True
    attention_output_bias = False   # llama.cpp declares none

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        kv.get_float("{arch}.attention.layer_norm_rms_epsilon")   # required
        if not hp.n_embd_head_k == hp.n_embd_head_v == hp.n_rot:
            raise HParamError(f"{kv.source}: {hp.arch} needs key_length = value_length = rope.dimension_count, "
                              f"found {hp.n_embd_head_k}, {hp.n_embd_head_v}, {hp.n_rot}")
        if kv.key("{arch}.rope.dimension_sections") in kv.metadata:
            raise HParamError(f"{kv.source}: multimodal RoPE sections (Hunyuan-VL) are not supported")
        alpha = kv.get_float("{arch}.rope.scaling.alpha", 0.0)
        if alpha > 0:
            d = hp.n_embd_head_k
            base = np.float32(hp.rope_freq_base_train) * powf(alpha, float(np.float32(d) / np.float32(d - 2)))
            hp = hp.with_changes(rope_freq_base_train=float(base), rope_freq_base_train_swa=float(base))
        return cls.read_experts(kv, hp)

    @classmethod
    def read_experts(cls, kv: HParamReader, hp: HParams) -> HParams:
        return hp

    @classmethod
    def has_experts(cls, hp: HParams, il: int) -> bool:
        return False

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        specs.append(TensorSpec("rope_freqs.weight", (hp.n_rot // 2,), optional=True))
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.qkv_specs(hp, il)
            specs += [TensorSpec(f"{blk}.attn_output.weight", (hp.n_embd_head_k * hp.n_head[il], hp.n_embd)),
                      TensorSpec(f"{blk}.attn_q_norm.weight", (hp.n_embd_head_k,)),
                      TensorSpec(f"{blk}.attn_k_norm.weight", (hp.n_embd_head_k,)),
                      TensorSpec(f"{blk}.ffn_norm.weight", (hp.n_embd,))]
            specs += cls.ffn_or_expert_specs(hp, il)
        return specs
