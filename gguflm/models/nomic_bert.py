"""nomic-bert (nomic-embed-text): BERT's encoder with rotary positions (split halves) instead of
position embeddings, a fused QKV projection and a SwiGLU feed-forward without biases."""

from __future__ import annotations

import numpy as np

from gguflm.graph import Graph
from gguflm.hparams import HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.bert import Bert


class NomicBert(Bert):
    name = "nomic-bert"
    rope_type = RopeType.NEOX
    rotary = True

    @classmethod
    def max_positions(cls, hp: HParams) -> int | None:
        return None

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        # llama.cpp declares no classification head for nomic-bert
        return [s for s in super().tensor_specs(hp) if not s.name.startswith("cls.")]

    @classmethod
    def ffn_tensor_specs(cls, hp: HParams, il: int) -> list[TensorSpec]:
        # llama.cpp declares the up and down biases (optional) but its graph ignores them
        return super().ffn_tensor_specs(hp, il) + [
            TensorSpec(f"blk.{il}.ffn_gate.weight", (hp.n_embd, hp.n_ff[il]))]

    def ffn(self, g: Graph, L, il: int, x: np.ndarray) -> np.ndarray:
        """SwiGLU: silu(gate) * up, then down."""
        gate, up = g.project(x, L.ffn_gate, L.ffn_up)
        (cur,) = g.project(g.swiglu(gate, up), L.ffn_down)
        return cur
