"""Gemma 4 (text): Gemma 3's block with other head sizes (and rotated dimensions)
in its sliding layers than in its global ones, the global layers' RoPE through ``rope_freqs``
(proportional RoPE), V RMS-normed without a weight and taken from K's projection where a layer has
no ``attn_v``, no query scaling (scores at scale 1), a learned scale of each block's output,
soft-capped logits, the last ``shared_kv_layers`` layers attending over the cached K and V of the
last earlier layer of their kind (KV sharing), and per-layer inputs (E2B, E4B): a small embedding
per token and layer that gates each block's output into a correction of it.

The 26B-A4B's layers with a router (``ffn_gate_inp``) run a mixture of GELU-gated experts beside
the dense feed-forward (its shared expert), each branch RMS-normed after: the router reads the
block's attention output RMS-normed without a weight, scaled by 1/sqrt(n_embd) and by its own
``ffn_gate_inp.scale``; softmax routing, the selected weights normalised; gate and up as one
tensor (``ffn_gate_up_exps``) or two; each expert's output scaled by ``ffn_down_exps.scale``
where the file has it."""

from __future__ import annotations

import numpy as np

from gguflm.errors import ModelLoadError
from gguflm.ggml_types import GGMLType
from gguflm.graph import GATING_SOFTMAX, GLU_GEGLU, Graph
from gguflm.hparams import (HParamError, HParamReader, HParams, RopeType, check_kv_sharing, read_expert_hparams,
                            read_swa_layers, rsqrt_f32, sqrt_f32)
from gguflm.models.base import Architecture, TensorSpec


class Gemma4(Architecture):
    name = "gemma4"
    rope_type = RopeType.NEOX

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        n_ple = kv.get_int("{arch}.embedding_length_per_layer_input")   # required, as by llama.cpp
        if not isinstance(kv.metadata.get(kv.key("{arch}.attention.sliding_window_pattern")), (list, tuple, np.ndarray)):
            raise HParamError(f"{kv.source}: {kv.key('{arch}.attention.sliding_window_pattern')} must be an array "
                              f"of one flag per layer")
        n_shared = kv.get_int("{arch}.attention.shared_kv_layers", 0)
        if not 0 <= n_shared <= hp.n_layer - 2:   # llama.cpp asserts two layers keep their K and V
            raise HParamError(f"{kv.source}: {kv.key('{arch}.attention.shared_kv_layers')} must be 0..{hp.n_layer - 2}, "
                              f"found {n_shared}")
        head_k_swa = kv.get_int("{arch}.attention.key_length_swa")
        head_v_swa = kv.get_int("{arch}.attention.value_length_swa")
        if hp.n_embd_head_k != hp.n_embd_head_v or head_k_swa != head_v_swa:
            raise HParamError(f"{kv.source}: Gemma 4 requires equal K and V head sizes, found {hp.n_embd_head_k} and "
                              f"{hp.n_embd_head_v} (sliding layers: {head_k_swa} and {head_v_swa})")
        hp = hp.with_changes(
            n_layer_kv_from_start=hp.n_layer - n_shared,
            n_swa=kv.get_int("{arch}.attention.sliding_window"),
            swa_layers=read_swa_layers(kv, hp.n_layer, 1),
            n_embd_head_k_swa=head_k_swa, n_embd_head_v_swa=head_v_swa,
            n_rot_swa=kv.get_int("{arch}.rope.dimension_count_swa", hp.n_rot),
            rope_freq_base_train_swa=kv.get_float("{arch}.rope.freq_base_swa", 10000.0),
            rope_freq_scale_train_swa=1.0,
            rope_freqs_swa=False,
            f_attention_scale=1.0,
            f_final_logit_softcapping=kv.get_float("{arch}.final_logit_softcapping", 30.0),
            f_embedding_scale=sqrt_f32(hp.n_embd),
            extras={**hp.extras, "n_embd_per_layer": n_ple},
        )
        hp = read_expert_hparams(kv, hp, required=False)
        check_kv_sharing(hp, kv.source)
        return hp

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        e = hp.n_embd
        specs = cls.output_specs(hp)
        full = [il for il in range(hp.n_layer) if not hp.is_swa(il)]
        if full:   # the global layers' frequency factors, one set for them all
            specs.append(TensorSpec("rope_freqs.weight", (hp.head_k(full[0]) // 2,)))
        n_ple = hp.extras["n_embd_per_layer"]
        if n_ple:   # per-layer inputs: a token embedding and a projection of the embedding, per layer
            specs += [TensorSpec("per_layer_token_embd.weight", (n_ple * hp.n_layer, hp.n_vocab)),
                      TensorSpec("per_layer_model_proj.weight", (e, n_ple * hp.n_layer)),
                      TensorSpec("per_layer_proj_norm.weight", (n_ple,))]
        for il in range(hp.n_layer):
            blk, dk, shared = f"blk.{il}", hp.head_k(il), hp.kv_source(il) != il   # shared: K, V unused
            specs += [
                TensorSpec(f"{blk}.attn_norm.weight", (e,)),
                TensorSpec(f"{blk}.attn_q.weight", (e, dk * hp.n_head[il])),
                TensorSpec(f"{blk}.attn_k.weight", (e, hp.n_embd_k_gqa(il)), optional=shared),
                TensorSpec(f"{blk}.attn_v.weight", (e, hp.n_embd_v_gqa(il)), optional=True),
                TensorSpec(f"{blk}.attn_output.weight", (dk * hp.n_head[il], e)),
                TensorSpec(f"{blk}.attn_q_norm.weight", (dk,)),
                TensorSpec(f"{blk}.attn_k_norm.weight", (dk,), optional=shared),
                TensorSpec(f"{blk}.post_attention_norm.weight", (e,)),
                TensorSpec(f"{blk}.layer_output_scale.weight", (1,), optional=True),
                TensorSpec(f"{blk}.ffn_norm.weight", (e,)),
            ]
            specs += cls.ffn_specs(hp, il)
            specs.append(TensorSpec(f"{blk}.post_ffw_norm.weight", (e,)))
            if hp.n_expert:
                specs += cls.expert_block_specs(hp, il)
            if n_ple:
                specs += [TensorSpec(f"{blk}.inp_gate.weight", (e, n_ple)), TensorSpec(f"{blk}.proj.weight", (n_ple, e)),
                          TensorSpec(f"{blk}.post_norm.weight", (e,))]
        return specs

    # a layer's experts: the router, then what a layer with one must have beside it
    EXPERT_TENSORS = ("ffn_gate_inp.weight", "ffn_gate_inp.scale", "pre_ffw_norm_2.weight", "post_ffw_norm_1.weight",
                      "post_ffw_norm_2.weight", "ffn_down_exps.weight")

    @classmethod
    def expert_block_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        """Layer ``il``'s experts, all optional: a layer has them where it has a router
        (llama.cpp's has_expert), see :meth:`required_together`."""
        blk, e, f, n = f"blk.{il}", hp.n_embd, hp.n_ff_exp, hp.n_expert
        shapes = {"ffn_gate_inp.weight": (e, n), "ffn_gate_inp.scale": (e,), "pre_ffw_norm_2.weight": (e,),
                  "post_ffw_norm_1.weight": (e,), "post_ffw_norm_2.weight": (e,), "ffn_down_exps.weight": (f, e, n),
                  "ffn_down_exps.scale": (n,), "ffn_gate_up_exps.weight": (e, 2 * f, n),
                  "ffn_gate_exps.weight": (e, f, n), "ffn_up_exps.weight": (e, f, n)}
        return [TensorSpec(f"{blk}.{name}", shape, optional=True) for name, shape in shapes.items()]

    @classmethod
    def required_together(cls, hp: HParams, present: set[str]) -> list[str]:
        """A layer with a router has its scale, the three norms, the down projections, and gate
        and up as one tensor or two (llama.cpp loads the pair where the one is absent); a layer
        with any of those has its router (llama.cpp would count them as tensors too many)."""
        need = []
        for il in range(hp.n_layer if hp.n_expert else 0):
            blk = f"blk.{il}"
            if f"{blk}.ffn_gate_inp.weight" in present:
                need += [f"{blk}.{name}" for name in cls.EXPERT_TENSORS[1:]]
                if f"{blk}.ffn_gate_up_exps.weight" not in present:
                    need += [f"{blk}.ffn_gate_exps.weight", f"{blk}.ffn_up_exps.weight"]
            elif any(s.name in present for s in cls.expert_block_specs(hp, il)):
                need.append(f"{blk}.ffn_gate_inp.weight")
        return need

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        # token rows scaled by sqrt(n_embd); rows given in their place as they are
        x = g.embed(m.tensors["token_embd.weight"], scale=hp.f_embedding_scale if g.ub.tokens is not None else 0.0)
        n_ple = hp.extras["n_embd_per_layer"]
        per_layer = self.per_layer_inputs(g, x) if n_ple else None          # [n, n_layer * n_ple]
        for il, L in g.layers():
            dk, n = hp.head_k(il), x.shape[0]
            # self-attention: Q, K normed per head with weights, V without; V is K's projection
            # where the layer has no V of its own
            cur = g.rms_norm(x, L.attn_norm)
            if hp.kv_source(il) != il:   # over an earlier layer's cached K and V: Q only
                (q,) = g.project(cur, L.attn_q)                                # [n, n_head * head_k(il)]
                g.rope(g.rms_norm_heads(q, L.attn_q_norm), il, hp.n_head[il])
                k = v = None
            else:
                if L.attn_v is not None:
                    q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)      # [n, n_head(_kv) * head_k(il)]
                else:
                    q, k = g.project(cur, L.attn_q, L.attn_k)
                    v = k
                v = g.rms_norm(v.reshape(-1, dk), None).reshape(n, -1)
                g.rope_qk(q, k, il, L.attn_q_norm, L.attn_k_norm)
            cur = g.attention(il, q, k, v, hp.f_attention_scale)               # [n, n_head * head_k(il)]
            (cur,) = g.project(cur, L.attn_output)                              # [n, n_embd]
            attn_out = g.add(g.rms_norm(cur, L.post_attention_norm), x)
            # feed-forward, GELU-gated, normed before and after; beside the experts where the layer has them
            gate, up = g.project(g.rms_norm(attn_out, L.ffn_norm), L.ffn_gate, L.ffn_up)
            (cur,) = g.project(g.geglu(gate, up), L.ffn_down)
            if hp.n_expert and L.ffn_gate_inp is not None:
                cur = g.add(g.rms_norm(cur, L.post_ffw_norm_1), self.experts(g, attn_out, L))
            x = g.add(g.rms_norm(cur, L.post_ffw_norm), attn_out)
            if per_layer is not None:   # the layer's input gated by the block's output, projected back
                (gate,) = g.project(x, L.inp_gate)                              # [n, n_ple]
                gate = g.mul(g.gelu(gate), per_layer[:, il * n_ple:(il + 1) * n_ple])
                (cur,) = g.project(gate, L.proj)                                # [n, n_embd]
                x = g.add(x, g.rms_norm(cur, L.post_norm))
            if L.layer_output_scale is not None:
                g.scale(x, _scalar(L.layer_output_scale))
        # every row through the final norm, then the output rows (llama.cpp's order for Gemma 4)
        (x,) = g.output_rows(g.rms_norm(x, m.tensors["output_norm.weight"]))
        return x, g.logits(x, m.tensors["output.weight"])                    # [n_outputs, n_vocab]

    @staticmethod
    def experts(g: Graph, attn_out: np.ndarray, L) -> np.ndarray:
        """The experts' branch of the block's attention output, RMS-normed after: routed on
        attn_out normed without a weight, times 1/sqrt(n_embd) and the router's scale."""
        hp = g.hparams
        _f32(L.ffn_gate_inp_scale, L.ffn_down_exps_scale)
        router_in = g.scale(g.rms_norm(attn_out, None), rsqrt_f32(hp.n_embd))
        g.plan.mul_row(router_in, L.ffn_gate_inp_scale.data.reshape(-1))
        (logits,) = g.project(router_in, L.ffn_gate_inp)                   # [n, n_expert]
        cur = g.moe_ffn(g.rms_norm(attn_out, L.pre_ffw_norm_2), L, norm_w=True, gating=GATING_SOFTMAX, w_scale=1.0,
                        logits=logits, act=GLU_GEGLU, gate_up=L.ffn_gate_up_exps, down_scale=L.ffn_down_exps_scale)
        return g.rms_norm(cur, L.post_ffw_norm_2)                           # [n, n_embd]

    @staticmethod
    def per_layer_inputs(g: Graph, x: np.ndarray) -> np.ndarray:
        """Every layer's input of n_embd_per_layer values per token ([n, n_layer * n_ple]): the
        token's per-layer embedding (scaled by sqrt(n_ple); for a given embedding, the padding
        token's) plus the scaled embedding x projected and RMS-normed per layer, times 1/sqrt(2)."""
        hp, t = g.hparams, g.model.tensors
        n_ple = hp.extras["n_embd_per_layer"]
        (proj,) = g.project(x, t["per_layer_model_proj.weight"])             # [n, n_layer * n_ple]
        g.scale(proj, rsqrt_f32(hp.n_embd))
        proj = g.rms_norm(proj.reshape(-1, n_ple), t["per_layer_proj_norm.weight"]).reshape(proj.shape)
        embd = t["per_layer_token_embd.weight"]
        if g.ub.tokens is None:
            g.add_matrix_row(proj, embd, 0, scale=sqrt_f32(n_ple))
        else:
            g.add(proj, g.scale(g.token_rows(embd), sqrt_f32(n_ple)))
        return g.scale(proj, rsqrt_f32(2))


def _f32(*weights) -> None:
    """Scale vectors are read as F32 (the ones a layer has)."""
    for w in weights:
        if w is not None and w.type != GGMLType.F32:
            raise ModelLoadError(f"tensor '{w.name}' is {w.type.name}; gguflm reads it as F32 only")


def _scalar(w) -> float:
    """A one-value F32 tensor's value (the block output scale ggml_mul broadcasts)."""
    if w.type != GGMLType.F32:
        raise ModelLoadError(f"tensor '{w.name}' is {w.type.name}; gguflm reads it as F32 only")
    return float(np.asarray(w.data).reshape(-1).view(np.float32)[0])
