"""Mistral 3 (Ministral 3's text model): Llama's block (RMSNorm, RoPE in adjacent pairs, GQA,
SwiGLU), with Llama 4's attention temperature where the file sets ``attention.temperature_scale``:
each query scaled after RoPE by log(floor(pos / n_ctx_orig) + 1) * scale + 1 of its position
(n_ctx_orig: the YaRN original context, which must then be set)."""

from __future__ import annotations

from gguflm.hparams import HParamError, HParamReader, HParams
from gguflm.models.llama import Llama


class Mistral3(Llama):
    name = "mistral3"

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        if hp.n_expert:
            raise HParamError(f"{kv.source}: mistral3 with experts is not supported")
        scale = kv.get_float("{arch}.attention.temperature_scale", 0.0)
        if not scale:
            return hp
        if not hp.n_ctx_orig_yarn:
            raise HParamError(f"{kv.source}: attention.temperature_scale needs a YaRN original context "
                              f"(rope.scaling.original_context_length), found 0")
        return hp.with_changes(f_attn_temp_scale=scale, f_attn_temp_offset=0.0,
                               n_attn_temp_floor_scale=hp.n_ctx_orig_yarn)
