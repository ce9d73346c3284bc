"""dots.llm1 (rednote's dots1): Qwen 3's block (per-head Q/K RMS norms, split-half RoPE) whose
feed-forward is dense in the first ``leading_dense_block_count`` layers and DeepSeek V3's mixture
of experts after them: the router's probabilities (the file's ``expert_gating_func``, sigmoid in
the released models) rank the experts after the selection bias ``exp_probs_b`` is added, the
unbiased ones weigh them (normalised to sum 1 and scaled where the file says), and every token
also runs ``expert_shared_count`` shared experts, one feed-forward without a gate."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguflm.graph import GATING_SIGMOID, GATING_SOFTMAX, GATING_SOFTMAX_WEIGHT
from gguflm.hparams import HParamError, HParamReader, HParams, read_expert_hparams
from gguflm.models.base import TensorSpec
from gguflm.models.qwen3 import Qwen3

if TYPE_CHECKING:
    from gguflm.model import Layer

# llama_expert_gating_func_type values build_moe_ffn runs (llama.cpp aborts on any other)
_GATING = {GATING_SOFTMAX: "softmax", GATING_SIGMOID: "sigmoid", GATING_SOFTMAX_WEIGHT: "softmax_weight"}


class Dots1(Qwen3):
    name = "dots1"
    required_output = True

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = super().read_hparams(kv, n_vocab)
        # llama.cpp declares K and V n_head * head_dim wide (no GQA) and asserts a full rotary
        if any(hp.n_head_kv[il] != hp.n_head[il] for il in range(hp.n_layer)):
            raise HParamError(f"{kv.source}: dots1 needs head_count_kv = head_count (llama.cpp declares K and V "
                              f"head_count heads wide), found {list(hp.n_head_kv)} for {list(hp.n_head)}")
        if hp.n_rot != hp.n_embd_head_k or hp.n_embd_head_v != hp.n_embd_head_k:
            raise HParamError(f"{kv.source}: dots1 needs rope.dimension_count = key_length = value_length, "
                              f"found {hp.n_rot}, {hp.n_embd_head_k}, {hp.n_embd_head_v}")
        return hp

    @classmethod
    def read_experts(cls, kv: HParamReader, hp: HParams) -> HParams:
        hp = read_expert_hparams(kv, hp)
        n_dense = kv.get_int("{arch}.leading_dense_block_count", 0)
        if not 0 <= n_dense <= hp.n_layer:
            raise HParamError(f"{kv.source}: {kv.key('{arch}.leading_dense_block_count')} must be "
                              f"0..{hp.n_layer} (block_count), found {n_dense}")
        n_ff_exp = kv.get_int("{arch}.expert_feed_forward_length")
        n_shared = kv.positive("expert_shared_count", kv.get_int("{arch}.expert_shared_count"))
        gating = kv.get_int("{arch}.expert_gating_func", 0)
        if gating not in _GATING:
            raise HParamError(f"{kv.source}: {kv.key('{arch}.expert_gating_func')} must be one of "
                              f"{sorted(_GATING)} ({', '.join(_GATING.values())}), found {gating}")
        return hp.with_changes(
            n_ff_exp=kv.positive("expert feed-forward length", n_ff_exp), n_ff_shexp=n_ff_exp * n_shared,
            n_layer_dense_lead=n_dense, expert_gating_func=gating,
            expert_weights_norm=kv.get_bool("{arch}.expert_weights_norm", False),
            expert_weights_scale=kv.get_float("{arch}.expert_weights_scale", 0.0))

    def routing(self, hp: HParams, L: Layer) -> dict:
        return {"gating": hp.expert_gating_func, "norm_w": hp.expert_weights_norm,
                "w_scale": hp.expert_weights_scale, "selection_bias": L.exp_probs_b_bias}

    @classmethod
    def has_experts(cls, hp: HParams, il: int) -> bool:
        return il >= hp.n_layer_dense_lead

    @classmethod
    def ffn_or_expert_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        if not cls.has_experts(hp, il):
            return cls.ffn_specs(hp, il)
        return super().ffn_or_expert_specs(hp, il) + [TensorSpec(f"blk.{il}.exp_probs_b.bias", (hp.n_expert,),
                                                                 optional=True)]
