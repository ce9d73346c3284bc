"""jina-bert-v3 (jina-embeddings-v3's XLM-RoBERTa encoder): BERT's encoder (post-norm, biased
GELU feed-forward, Q, K and V fused or apart) with rotary positions in split halves instead of
position embeddings; the token-type count must be set, its embedding may be absent; no
classification head."""

from __future__ import annotations

from gguflm.hparams import HParams, RopeType
from gguflm.models.base import TensorSpec
from gguflm.models.bert import Bert


class JinaBertV3(Bert):
    name = "jina-bert-v3"
    rope_type = RopeType.NEOX
    rotary = True

    @classmethod
    def max_positions(cls, hp: HParams) -> int | None:
        return None

    @classmethod
    def tensor_specs(cls, hp: HParams) -> list[TensorSpec]:
        return [s for s in super().tensor_specs(hp) if not s.name.startswith("cls.")]
