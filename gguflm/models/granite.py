"""Granite (3.x): Llama's block with four scales: the token embeddings, every attention and
feed-forward output before it joins the residual stream, the attention scores, and the logits
(divided by ``logit_scale``); ``rope.scaling.finetuned`` false turns RoPE off. A file with
``expert_count`` has a mixture of SwiGLU experts (normalised softmax routing) and, with
``expert_shared_feed_forward_length``, an ungated shared expert.

Granite MoE is the same graph and tensors under another name."""

from __future__ import annotations

import numpy as np

from gguflm.hparams import HParamError, HParamReader, HParams, RopeType, read_expert_hparams
from gguflm.models.llama import Llama


class Granite(Llama):
    name = "granite"

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        rope = kv.get_bool("{arch}.rope.scaling.finetuned", True)
        logit_scale = np.float32(kv.get_float("{arch}.logit_scale"))
        if logit_scale == 0:
            raise HParamError(f"{kv.source}: {kv.key('{arch}.logit_scale')} must not be 0")
        return hp.with_changes(
            f_logit_scale=float(np.float32(1) / logit_scale),   # ggml_scale(logits, 1.0f / logit_scale)
            f_residual_scale=kv.get_float("{arch}.residual_scale", 0.0),
            f_embedding_scale=kv.get_float("{arch}.embedding_scale", 0.0),
            f_attention_scale=kv.get_float("{arch}.attention.scale", 0.0),
            rope_type=hp.rope_type if rope else RopeType.NONE,
        )

    @classmethod
    def read_experts(cls, kv: HParamReader, hp: HParams) -> HParams:
        return read_expert_hparams(kv, hp, required=False, n_ff_exp_key=False, shared=True)


class GraniteMoe(Granite):
    """Granite MoE (3.x MoE): Granite's graph and tensors, with experts."""

    name = "granitemoe"
