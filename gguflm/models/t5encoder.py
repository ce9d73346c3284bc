"""T5 and FLAN-T5 encoders alone (sentence embeddings): RMS norms without bias before attention
and feed-forward, no position embeddings; every layer's attention scores get a bias per head from
the relative position bucket of each key (``attn_rel_b``, which layers without one take from the
first layer), attention unscaled; a GELU-gated feed-forward (FLAN-T5) or a ReLU one (T5). It runs
as an encoder, without a KV cache: non-causal when encoded (``Context.encode``), causal within
the ubatch when decoded (llama.cpp's decode of it, which ``Llama.embed`` runs).

:class:`T5Encoder` holds what the ``t5`` encoder-decoder shares (its encoder pass, the tensors
under ``enc.``); :mod:`gguflm.models.t5` adds the decoder.
"""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamReader, HParams, RopeType
from gguflm.models.base import Architecture, TensorSpec


class T5Encoder(Architecture):
    name = "t5encoder"
    rope_type = RopeType.NONE
    kv_cache = False
    has_encoder = True
    has_decoder = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        return hp.with_changes(extras={**hp.extras,
                                       "n_rel_attn_bkts": kv.get_int("{arch}.attention.relative_buckets_count")})

    # -- tensors

    @staticmethod
    def t5_block_specs(hp: HParams, prefix: str, il: int, parts: tuple[str, ...]) -> list[TensorSpec]:
        """One T5 block's tensors under ``prefix`` (``enc``, ``dec``): per attention part (``attn``,
        ``cross_attn``) its norm, optional bucket biases and Q, K, V, O; then the feed-forward."""
        b, e, nb = f"{prefix}.blk.{il}", hp.n_embd, hp.extras["n_rel_attn_bkts"]
        specs = []
        for part in parts:
            specs += [TensorSpec(f"{b}.{part}_norm.weight", (e,)),
                      TensorSpec(f"{b}.{part}_rel_b.weight", (hp.n_head[il], nb), optional=True),
                      TensorSpec(f"{b}.{part}_q.weight", (e, hp.n_embd_k_gqa(il))),
                      TensorSpec(f"{b}.{part}_k.weight", (e, hp.n_embd_k_gqa(il))),
                      TensorSpec(f"{b}.{part}_v.weight", (e, hp.n_embd_v_gqa(il))),
                      TensorSpec(f"{b}.{part}_o.weight", (hp.n_embd_v_gqa(il), e))]
        return specs + [TensorSpec(f"{b}.ffn_norm.weight", (e,)),
                        TensorSpec(f"{b}.ffn_gate.weight", (e, hp.n_ff[il]), optional=True),
                        TensorSpec(f"{b}.ffn_down.weight", (hp.n_ff[il], e)),
                        TensorSpec(f"{b}.ffn_up.weight", (e, hp.n_ff[il]))]

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        specs = [TensorSpec("token_embd.weight", (hp.n_embd, hp.n_vocab)),
                 TensorSpec("enc.output_norm.weight", (hp.n_embd,))]
        for il in range(hp.n_layer):
            specs += cls.t5_block_specs(hp, "enc", il, ("attn",))
        return specs

    # -- forward pass

    @staticmethod
    def rel_bias(g: Graph, prefix: str, part: str, il: int) -> np.ndarray:
        """Layer ``il``'s bucket biases, else the first layer's (llama.cpp's fallback)."""
        t = g.model.tensors
        w = t.get(f"{prefix}.blk.{il}.{part}_rel_b.weight")
        return g.t5_rel_bias(t[f"{prefix}.blk.0.{part}_rel_b.weight"] if w is None else w)

    @staticmethod
    def t5_ffn(g: Graph, b: str, x: np.ndarray) -> np.ndarray:
        """FLAN-T5's gelu(gate) * up, or T5's relu(up), then down."""
        t = g.model.tensors
        gate = t.get(f"{b}.ffn_gate.weight")
        if gate is not None:
            gated, up = g.project(x, gate, t[f"{b}.ffn_up.weight"])
            cur = g.geglu(gated, up)
        else:
            (cur,) = g.project(x, t[f"{b}.ffn_up.weight"])
            cur = g.relu(cur)
        (cur,) = g.project(cur, t[f"{b}.ffn_down.weight"])
        return cur

    def encode(self, g: Graph) -> np.ndarray:
        """The encoder pass (llama.cpp's t5 graph<true>): the normed final hidden states."""
        hp, t = g.hparams, g.model.tensors
        # llama_encode attends both ways; llama.cpp's decode of a t5encoder (which it gives a KV
        # cache, unused) keeps the model's causal mask within the ubatch
        causal = hp.causal_attn and not g.encoding
        x = g.embed(t["token_embd.weight"])                                   # [n_tokens, n_embd]
        for il, _ in g.layers():
            b = f"enc.blk.{il}"
            cur = g.rms_norm(x, t[f"{b}.attn_norm.weight"])
            q, k, v = g.project(cur, t[f"{b}.attn_q.weight"], t[f"{b}.attn_k.weight"], t[f"{b}.attn_v.weight"])
            cur = g.attention(il, q, k, v, 1.0, rel_bias=self.rel_bias(g, "enc", "attn", il), causal_no_cache=causal)
            (cur,) = g.project(cur, t[f"{b}.attn_o.weight"])                  # [n_tokens, n_embd]
            if il == hp.n_layer - 1:
                cur, x = g.output_rows(cur, x)
            ffn_inp = g.add(cur, x)
            cur = self.t5_ffn(g, b, g.rms_norm(ffn_inp, t[f"{b}.ffn_norm.weight"]))
            x = g.add(cur, ffn_inp)
        return g.rms_norm(x, t["enc.output_norm.weight"])

    def forward(self, g: Graph) -> tuple[np.ndarray, None]:
        return self.encode(g), None
