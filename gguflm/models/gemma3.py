"""Gemma 3: Gemma 2's block with per-head Q/K norms and no soft-capping; five sliding-window
layers with their own RoPE base to every global layer."""

from __future__ import annotations

from gguflm.hparams import HParamReader, HParams, read_swa_layers, rsqrt_f32, sqrt_f32
from gguflm.models.base import TensorSpec
from gguflm.models.gemma2 import Gemma2


class Gemma3(Gemma2):
    name = "gemma3"
    untied_output = True
    qk_norm = True
    scale_given_embeddings = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        # the 27B model (62 layers) scales queries by 1/sqrt(n_embd / n_head), the others by
        # 1/sqrt(head_dim)
        head_for_scale = hp.n_embd // hp.n_head[0] if hp.n_layer == 62 else hp.n_embd_head_k
        return hp.with_changes(
            n_swa=kv.get_int("{arch}.attention.sliding_window"),
            swa_layers=read_swa_layers(kv, hp.n_layer, 6),
            rope_freq_base_train_swa=kv.get_float("{arch}.rope.freq_base_swa", 10000.0),
            rope_freq_scale_train_swa=1.0,
            f_attention_scale=rsqrt_f32(head_for_scale),
            f_embedding_scale=sqrt_f32(hp.n_embd),
        )

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = []
        for spec in super().tensor_specs(hp):
            specs.append(spec)
            if spec.name.endswith(".attn_output.weight"):
                blk = spec.name.rsplit(".", 2)[0]
                specs += [TensorSpec(f"{blk}.attn_q_norm.weight", (hp.n_embd_head_k,)),
                          TensorSpec(f"{blk}.attn_k_norm.weight", (hp.n_embd_head_k,))]
        return specs
