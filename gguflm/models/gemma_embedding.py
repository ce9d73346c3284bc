"""EmbeddingGemma: Gemma 3's block as an encoder. Attention is bidirectional, over the ubatch
itself (no KV cache: a batch is one ubatch); its sliding-window layers see n_swa / 2 positions
either way. The final hidden states are pooled and, in files converted with sentence-transformers'
dense modules, projected after pooling by ``dense_2`` (n_embd -> dense_2_feat_out) and ``dense_3``
(back to n_embd): :meth:`gguflm.graph.Graph.dense_out`."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParamError, HParamReader, HParams, read_swa_layers, rsqrt_f32, sqrt_f32
from gguflm.models.base import TensorSpec
from gguflm.models.gemma3 import Gemma3

DENSE_KEYS = ("dense_2_feat_in", "dense_2_feat_out", "dense_3_feat_in", "dense_3_feat_out")


class GemmaEmbedding(Gemma3):
    name = "gemma-embedding"
    kv_cache = False

    @classmethod
    def read_hparams(cls, kv: HParamReader, n_vocab: int) -> HParams:
        hp = cls.read_common(kv, n_vocab)
        dense = {key: kv.get_int(f"{{arch}}.{key}", 0) for key in DENSE_KEYS}
        # llama.cpp asserts both: the projections start and end at the model's width
        for key in ("dense_2_feat_in", "dense_3_feat_out"):
            if dense[key] not in (0, hp.n_embd):
                raise HParamError(f"{kv.source}: {kv.key('{arch}.' + key)} must be embedding_length "
                                  f"({hp.n_embd}), found {dense[key]}")
        return hp.with_changes(
            causal_attn=False,
            n_swa=kv.get_int("{arch}.attention.sliding_window"),
            swa_layers=read_swa_layers(kv, hp.n_layer, 6),
            swa_symmetric=True,
            rope_freq_base_train_swa=kv.get_float("{arch}.rope.freq_base_swa", 10000.0),
            rope_freq_scale_train_swa=1.0,
            f_attention_scale=rsqrt_f32(hp.n_embd_head_k),
            f_embedding_scale=sqrt_f32(hp.n_embd),
            extras={**hp.extras, **dense},
        )

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        x = hp.extras
        return super().tensor_specs(hp) + [
            TensorSpec("dense_2.weight", (hp.n_embd, x["dense_2_feat_out"]), optional=True),
            TensorSpec("dense_3.weight", (x["dense_3_feat_in"], hp.n_embd), optional=True)]

    @classmethod
    def required_together(cls, hp: HParams, present: set[str]) -> list[str]:
        # one projection without the other would leave embeddings of another width than n_embd
        dense = ["dense_2.weight", "dense_3.weight"]
        return dense if present & set(dense) else []

    def forward(self, g: Graph) -> tuple[np.ndarray, None]:
        return self.hidden(g), None
