"""Gemma 3n (text): Gemma 3's attention (per-head Q/K norms, V RMS-normed without a weight, no
query scaling, four sliding layers to each global one) inside AltUp, Laurel and per-layer inputs.

AltUp keeps ALTUP_N streams of the hidden state: the scaled embedding and its projections through
``altup_proj`` (rescaled to its magnitude). Each block predicts every stream as a mix of all of
them, with coefficients a router reads off stream 0; only stream 0's prediction runs through the
block, whose output then corrects every prediction. Laurel adds a low-rank residual (``laurel_l``,
``laurel_r``) of the normed block input; the feed-forward's gate of the first ten layers is made
sparse (the gaussian top-k); the corrected stream 0 gates the layer's per-layer input (as Gemma 4's
E2B) into a correction of the other streams. After the blocks the streams come back through
``altup_unembd_proj`` and are averaged. The layers from the 20th on attend over the cached K and V
of layer 18 (sliding) or 19 (global). llama.cpp fixes these numbers (4 streams, per-layer inputs of
256, Laurel's rank from its tensors, ten sparse layers, twenty with a cache) rather than reading
them: so does this file."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gguflm._ext.plan import ALTUP_N
from gguflm.graph import Graph
from gguflm.hparams import (HParamError, HParamReader, HParams, RopeType, check_kv_sharing, read_swa_layers,
                             rsqrt_f32, sqrt_f32)
from gguflm.models.base import Architecture, TensorSpec
from gguflm.models.gemma4 import Gemma4

if TYPE_CHECKING:
    from gguflm.loader import Weight
    from gguflm.model import Layer

N_EMBD_ALTUP = 256         # per-layer input values per token and layer (llama.cpp's n_embd_altup)
LAUREL_RANK = 64
N_LAYER_SPARSITY = 10      # layers whose feed-forward gate goes through the gaussian top-k
N_LAYER_KV = 20            # layers that keep their own K and V (llama.cpp's n_layer_kv_from_start)


class Gemma3n(Architecture):
    name = "gemma3n"
    rope_type = RopeType.NEOX

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        hp = hp.with_changes(
            n_layer_kv_from_start=N_LAYER_KV,
            n_swa=kv.get_int("{arch}.attention.sliding_window"),
            swa_layers=read_swa_layers(kv, hp.n_layer, 5),
            rope_freq_base_train_swa=kv.get_float("{arch}.rope.freq_base_swa", 10000.0),
            rope_freq_scale_train_swa=1.0,
            f_attention_scale=1.0,
            f_final_logit_softcapping=30.0,   # llama.cpp reads no key for it here
            f_embedding_scale=sqrt_f32(hp.n_embd),
            extras={**hp.extras, "n_embd_per_layer": N_EMBD_ALTUP},
        )
        if hp.n_embd_head_k != hp.n_embd_head_v:
            raise HParamError(f"{kv.source}: Gemma 3n requires equal K and V head sizes, found "
                              f"{hp.n_embd_head_k} and {hp.n_embd_head_v}")
        check_kv_sharing(hp, kv.source)
        return hp

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e, dk, n_ple = hp.n_embd, hp.n_embd_head_k, N_EMBD_ALTUP
        specs = cls.output_specs(hp) + [
            TensorSpec("altup_proj.weight", (e, e, ALTUP_N - 1)),
            TensorSpec("altup_unembd_proj.weight", (e, e, ALTUP_N - 1)),
            TensorSpec("per_layer_token_embd.weight", (n_ple * hp.n_layer, hp.n_vocab)),
            TensorSpec("per_layer_model_proj.weight", (e, n_ple * hp.n_layer)),
            TensorSpec("per_layer_proj_norm.weight", (n_ple,)),
        ]
        for il in range(hp.n_layer):
            blk = f"blk.{il}"
            specs.append(TensorSpec(f"{blk}.attn_norm.weight", (e,)))
            specs += cls.attention_specs(hp, il)   # K and V in every layer, as llama.cpp loads them
            specs += [TensorSpec(f"{blk}.attn_q_norm.weight", (dk,)), TensorSpec(f"{blk}.attn_k_norm.weight", (dk,)),
                      TensorSpec(f"{blk}.post_attention_norm.weight", (e,)), TensorSpec(f"{blk}.ffn_norm.weight", (e,))]
            specs += cls.ffn_specs(hp, il)
            specs += [
                TensorSpec(f"{blk}.post_ffw_norm.weight", (e,)),
                TensorSpec(f"{blk}.inp_gate.weight", (e, n_ple)),
                TensorSpec(f"{blk}.proj.weight", (n_ple, e)),
                TensorSpec(f"{blk}.post_norm.weight", (e,)),
                TensorSpec(f"{blk}.altup_correct_coef.weight", (ALTUP_N, ALTUP_N)),
                TensorSpec(f"{blk}.altup_correct_scale.weight", (e,)),
                TensorSpec(f"{blk}.altup_predict_coef.weight", (ALTUP_N, ALTUP_N * ALTUP_N)),
                TensorSpec(f"{blk}.altup_router.weight", (e, ALTUP_N)),
                TensorSpec(f"{blk}.altup_router_norm.weight", (e,)),
                TensorSpec(f"{blk}.laurel_l.weight", (e, LAUREL_RANK)),
                TensorSpec(f"{blk}.laurel_r.weight", (LAUREL_RANK, e)),
                TensorSpec(f"{blk}.laurel_post_norm.weight", (e,)),
            ]
        return specs

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, t = g.hparams, g.model.tensors
        n_ple = N_EMBD_ALTUP
        # token rows scaled by sqrt(n_embd); rows given in their place as they are
        x = g.embed(t["token_embd.weight"], scale=hp.f_embedding_scale if g.ub.tokens is not None else 0.0)
        n = x.shape[0]
        per_layer = Gemma4.per_layer_inputs(g, x)                           # [n, n_layer * n_ple]
        stack = g.altup_streams(x, t["altup_proj.weight"])                 # [ALTUP_N, n, n_embd]
        for il, L in g.layers():
            pred = g.altup_predict(stack, self.router(g, stack[0], L, L.altup_predict_coef))
            active = pred[0]
            cur = g.rms_norm(active, L.attn_norm)
            # Laurel: the normed input plus its low-rank projection, normed
            (lo,) = g.project(cur, L.laurel_l)                                 # [n, rank]
            (laurel,) = g.project(lo, L.laurel_r)                              # [n, n_embd]
            laurel = g.add(g.rms_norm(laurel, L.laurel_post_norm), cur)
            # self-attention: Q, K normed per head with weights, V without; the layers past the
            # 20th attend over an earlier layer's cache with Q only
            if hp.kv_source(il) != il:
                (q,) = g.project(cur, L.attn_q)                                # [n, n_head * head_dim]
                g.rope(g.rms_norm_heads(q, L.attn_q_norm), il, hp.n_head[il])
                k = v = None
            else:
                q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)
                v = g.rms_norm(v.reshape(-1, hp.n_embd_head_v), None).reshape(n, -1)
                g.rope_qk(q, k, il, L.attn_q_norm, L.attn_k_norm)
            cur = g.attention(il, q, k, v, hp.f_attention_scale)                # [n, n_head * head_dim]
            (cur,) = g.project(cur, L.attn_output)                              # [n, n_embd]
            cur = g.add(g.rms_norm(cur, L.post_attention_norm), active)
            attn_laurel = g.scale(g.add(cur, laurel), rsqrt_f32(2))
            # feed-forward: GELU of the (first layers: sparse) gate times up, normed before and after
            up, gate = g.project(g.rms_norm(attn_laurel, L.ffn_norm), L.ffn_up, L.ffn_gate)
            if il < N_LAYER_SPARSITY:
                g.gaussian_topk(gate)
            (cur,) = g.project(g.mul(up, g.gelu(gate)), L.ffn_down)
            out = g.add(g.rms_norm(cur, L.post_ffw_norm), attn_laurel)
            stack = g.altup_correct(pred, out, self.router(g, out, L, L.altup_correct_coef))
            # the corrected stream 0 gates the layer's per-layer input into a correction of the others
            (gate,) = g.project(g.scaled_rows(stack[0], L.altup_correct_scale), L.inp_gate)   # [n, n_ple]
            gate = g.mul(g.gelu(gate), per_layer[:, il * n_ple:(il + 1) * n_ple])
            (cur,) = g.project(gate, L.proj)                                    # [n, n_embd]
            cur = g.rms_norm(cur, L.post_norm)
            for j in range(1, ALTUP_N):
                g.add(stack[j], cur)
            g.altup_layer_output(stack)
        x = g.altup_merge(stack, t["altup_unembd_proj.weight"])             # [n, n_embd]
        (x,) = g.output_rows(x)
        x = g.rms_norm(x, t["output_norm.weight"])
        return x, g.logits(x, t["output.weight"])                            # [n_outputs, n_vocab]

    @staticmethod
    def router(g: Graph, x: np.ndarray, L: Layer, coef: Weight) -> np.ndarray:
        """AltUp's mixing coefficients of each row of x: tanh of the router over x RMS-normed
        (``altup_router_norm``) and scaled by 1/n_embd, through ``coef`` (predict's ALTUP_N^2, or
        correct's ALTUP_N per row)."""
        cur = g.scale(g.rms_norm(x, L.altup_router_norm), 1.0 / g.hparams.n_embd)
        (modalities,) = g.project(cur, L.altup_router)                     # [n, ALTUP_N]
        (coefs,) = g.project(g.tanh(modalities), coef)
        return coefs
