"""ERNIE 4.5 MoE (ernie4_5-moe: ERNIE-4.5-21B-A3B, 300B-A47B): ERNIE 4.5's block whose feed-forward
is dense in the first ``leading_dense_block_count`` layers and routed experts after them, as
build_moe_ffn runs them for it: softmax scores ranked with the selection bias ``exp_probs_b``
where a layer has one, the selected weights always normalised (never scaled), beside a shared
expert ``expert_shared_feed_forward_length`` wide where the file gives one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguflm.graph import GATING_SOFTMAX
from gguflm.hparams import HParamError, HParamReader, HParams, read_expert_hparams
from gguflm.models.ernie4_5 import Ernie4_5
from gguflm.models.llama import RoutedExperts

if TYPE_CHECKING:
    from gguflm.model import Layer


class Ernie4_5Moe(RoutedExperts, Ernie4_5):
    name = "ernie4_5-moe"

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        kv.get_float("{arch}.attention.layer_norm_rms_epsilon")   # required
        if not hp.n_embd_head_k == hp.n_embd_head_v == hp.n_rot:
            raise HParamError(f"{kv.source}: ernie4_5-moe needs key_length = value_length = rope.dimension_count, "
                              f"found {hp.n_embd_head_k}, {hp.n_embd_head_v}, {hp.n_rot}")
        kv.positive("expert feed-forward length", kv.get_int("{arch}.expert_feed_forward_length"))
        hp = read_expert_hparams(kv, hp, shared=True)
        n_dense = kv.get_int("{arch}.leading_dense_block_count", 0)
        step = kv.positive("interleave_moe_layer_step", kv.get_int("{arch}.interleave_moe_layer_step"))
        # llama.cpp declares experts for every layer from n_dense on, and its graph runs them in
        # the layers of the step only: files where the two differ it cannot run
        if not 0 <= n_dense <= hp.n_layer or any((il + 1) % step for il in range(n_dense, hp.n_layer)):
            raise HParamError(f"{kv.source}: ernie4_5-moe runs experts in every layer from leading_dense_block_count "
                              f"on, found {n_dense} dense layers and interleave_moe_layer_step {step}")
        return hp.with_changes(n_layer_dense_lead=n_dense)

    def routing(self, hp: HParams, L: Layer) -> dict:
        return {"gating": GATING_SOFTMAX, "norm_w": True, "selection_bias": L.exp_probs_b_bias}
