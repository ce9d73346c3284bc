"""dots.llm1 (rednote's dots1): Qwen 3's block (per-head Q/K RMS norms, split-half RoPE) whose
feed-forward is dense in the first ``leading_dense_block_count`` layers and DeepSeek V3's mixture
of experts after them (:func:`gguflm.hparams.read_routed_expert_hparams`): the router's
probabilities (the file's ``expert_gating_func``, sigmoid in the released models) rank the experts
after the selection bias ``exp_probs_b`` is added, the unbiased ones weigh them (normalised to sum
1 and scaled where the file says), and every token also runs ``expert_shared_count`` shared
experts, one feed-forward without a gate."""

from __future__ import annotations

from gguflm.hparams import HParamError, HParamReader, HParams, read_routed_expert_hparams
from gguflm.models.llama import RoutedExperts
from gguflm.models.qwen3 import Qwen3


class Dots1(RoutedExperts, Qwen3):
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
        return read_routed_expert_hparams(kv, hp)
