"""Llama 4 (Scout, Maverick): Llama's block with a mixture of SwiGLU experts in every
``interleave_moe_layer_step``-th layer (the others dense), routed top-k on the router's logits
with sigmoid weights that scale each expert's input (not its output), beside an ungated shared
expert as wide as one expert. Three of every four layers attend within chunks of 8192 positions
(llama.cpp's chunked window) with RoPE and, except the 128-expert model, Q and K RMS-normed per
head without a weight after it; every fourth layer attends over everything without RoPE, its
queries scaled by the attention temperature of their position (log(floor((pos + 1) / 8192) + 1)
* 0.1 + 1).

llama.cpp 0.3.36 fixes the chunk, the temperature and which layers rotate as above whatever the
file says, save a file with ``attention.sliding_window`` 0: llama.cpp then aborts on its first
decode (its graph reads a temperature it never set), and gguflm refuses such a file."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gguflm.graph import GATING_SIGMOID, Graph
from gguflm.hparams import HParamError, HParamReader, HParams, read_expert_hparams, read_swa_layers
from gguflm.models.llama import Llama

if TYPE_CHECKING:
    from gguflm.model import Layer

# llama.cpp's llama4 hyper-parameters, set in its loader rather than read from the file
CHUNK = 8192
NO_ROPE_STEP = 4
TEMP_SCALE, TEMP_OFFSET = 0.1, 1.0
# the expert count of the one model without Q/K norms (Maverick, 17B-128E)
NO_KQ_NORM_EXPERTS = 128


class Llama4(Llama):
    name = "llama4"
    attention_bias = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        kv.get_float("{arch}.attention.layer_norm_rms_epsilon")        # required, as by llama.cpp
        kv.get_int("{arch}.expert_feed_forward_length")                # required
        hp = read_expert_hparams(kv, hp)                                # llama.cpp refuses zero experts
        step = kv.get_int("{arch}.interleave_moe_layer_step")           # required
        if kv.get_int("{arch}.attention.sliding_window", CHUNK) == 0:
            raise HParamError(f"{kv.source}: {kv.key('{arch}.attention.sliding_window')} 0 (no chunked attention): "
                              f"llama.cpp aborts on such a llama4 model (its attention temperature is unset)")
        return hp.with_changes(
            n_swa=CHUNK, swa_chunked=True, swa_layers=read_swa_layers(kv, hp.n_layer, 4),
            no_rope_layers=tuple((il + 1) % NO_ROPE_STEP == 0 for il in range(hp.n_layer)),
            rope_freq_base_train_swa=kv.get_float("{arch}.rope.freq_base_swa", hp.rope_freq_base_train),
            rope_freq_scale_train_swa=hp.rope_freq_scale_train,
            f_attn_temp_scale=TEMP_SCALE, f_attn_temp_offset=TEMP_OFFSET, n_attn_temp_floor_scale=CHUNK,
            n_ff_shexp=hp.n_ff_exp,
            extras={**hp.extras, "moe_layer_step": step, "kq_norm": hp.n_expert != NO_KQ_NORM_EXPERTS})

    @classmethod
    def has_experts(cls, hp: HParams, il: int) -> bool:
        step = hp.extras["moe_layer_step"]
        return step > 0 and (il + 1) % step == 0

    def routing(self, hp: HParams, L: Layer) -> dict:
        return {"gating": GATING_SIGMOID, "norm_w": False, "weight_before": True}

    def forward(self, g: Graph) -> tuple[np.ndarray, np.ndarray]:
        hp, m = g.hparams, g.model
        x = g.embed(m.tensors["token_embd.weight"])                        # [n_tokens, n_embd]
        for il, L in g.layers():
            cur = g.rms_norm(x, L.attn_norm)
            q, k, v = g.project(cur, L.attn_q, L.attn_k, L.attn_v)         # [n_tokens, n_head(_kv) * head_dim]
            if hp.has_rope(il):
                g.rope(q, il, hp.n_head[il])
                g.rope(k, il, hp.n_head_kv[il])
                if hp.extras["kq_norm"]:   # per head, without a weight
                    q = g.rms_norm(q.reshape(-1, hp.n_embd_head_k), None).reshape(q.shape)
                    k = g.rms_norm(k.reshape(-1, hp.n_embd_head_k), None).reshape(k.shape)
            else:
                g.attn_temperature(q)
            cur = g.attention(il, q, k, v, hp.kq_scale)                    # [n_tokens, n_head * head_dim]
            (cur,) = g.project(cur, L.attn_output)                         # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                x, cur = g.output_rows(x, cur)                             # [n_outputs, n_embd]
            g.add(x, cur)
            g.add(x, self.ffn(g, g.rms_norm(x, L.ffn_norm), L, il))       # dense, or experts and the shared one
        x = g.rms_norm(x, m.tensors["output_norm.weight"])
        return x, g.logits(x, m.tensors["output.weight"])                 # [n_outputs, n_vocab]
