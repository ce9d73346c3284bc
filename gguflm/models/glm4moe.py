"""GLM-4.5 / GLM-4.5-Air (glm4moe): Llama's block with optional Q/K/V biases and per-head Q/K
RMS norms (the 355B model's), split-half RoPE over the first ``rope.dimension_count`` values of
each head, the norm before the feed-forward stored as ``post_attention_norm``, and DeepSeek's
mixture of experts (:class:`gguflm.models.llama.RoutedExperts`: sigmoid scores by default, the
selection bias every expert layer has, dense leading layers, ungated shared experts). The file's
NextN (multi-token prediction) blocks are skipped, as llama.cpp skips them at inference."""

from __future__ import annotations

from gguflm.graph import GATING_SIGMOID
from gguflm.hparams import HParamError, HParamReader, HParams, RopeType, drop_nextn_layers, read_routed_expert_hparams
from gguflm.models.base import TensorSpec
from gguflm.models.llama import Llama, RoutedExperts


class Glm4Moe(RoutedExperts, Llama):
    name = "glm4moe"
    rope_type = RopeType.NEOX
    qk_norm = True                 # where the layer has the norms
    attention_output_bias = False  # llama.cpp declares none
    probs_bias_required = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = drop_nextn_layers(kv, cls.read_common(kv, n_vocab))
        kv.get_float("{arch}.attention.layer_norm_rms_epsilon")   # required
        if hp.n_embd_head_k != hp.n_embd_head_v:
            raise HParamError(f"{kv.source}: glm4moe needs key_length = value_length, found "
                              f"{hp.n_embd_head_k} and {hp.n_embd_head_v}")
        if kv.key("{arch}.rope.dimension_sections") in kv.metadata:
            raise HParamError(f"{kv.source}: multimodal RoPE sections (GLM-4.5V) are not supported")
        return read_routed_expert_hparams(kv, hp, gating=GATING_SIGMOID)

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = cls.output_specs(hp)
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (hp.n_embd,)))
            specs += cls.qkv_specs(hp, il)
            specs += [TensorSpec(f"{blk}.attn_output.weight", (hp.n_embd_head_k * hp.n_head[il], hp.n_embd)),
                      TensorSpec(f"{blk}.attn_q_norm.weight", (hp.n_embd_head_k,), optional=True),
                      TensorSpec(f"{blk}.attn_k_norm.weight", (hp.n_embd_head_k,), optional=True),
                      TensorSpec(f"{blk}.post_attention_norm.weight", (hp.n_embd,), field="ffn_norm")]
            specs += cls.ffn_or_expert_specs(hp, il)
        return specs
