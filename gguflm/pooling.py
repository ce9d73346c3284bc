"""Pooling: how a context turns the hidden states of a ubatch into one vector (or score) per
sequence, as llama.cpp's ``build_pooling`` does it inside the forward pass (its stage there:
:meth:`gguflm.graph.Graph.pooling`).

``none`` keeps every token's row; ``mean`` averages a sequence's rows (through ggml's F32 mul_mat
by a [n_seqs, n_tokens] matrix of 1/n weights, whose lane order the result keeps); ``cls`` takes a
sequence's first token, ``last`` its last; ``rank`` takes the first token (the last with causal
attention; the mean where ``{arch}.classifier.pooling_type`` says so) through the model's
classification head (``cls``, tanh, ``cls.output``), one score per output label. Pooling is per ubatch: a sequence split over two ubatches gets the later one's
result, as in llama.cpp.

Names and numbers are llama.cpp's (``LLAMA_POOLING_TYPE_*``, which llama-cpp-python exposes as
``llama_cpp.LLAMA_POOLING_TYPE_*``); ``unspecified`` takes the model's ``{arch}.pooling_type``,
else ``none``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gguflm.hparams import HParams


class PoolingType(IntEnum):
    """llama.cpp's ``enum llama_pooling_type``."""

    UNSPECIFIED = -1
    NONE = 0
    MEAN = 1
    CLS = 2
    LAST = 3
    RANK = 4

    @property
    def label(self) -> str:
        return self.name.lower()


POOLING_NAMES = tuple(p.label for p in PoolingType if p is not PoolingType.UNSPECIFIED)


def pooling_type(value: str | int | None) -> PoolingType:
    """A pooling type from its name (``"mean"``), llama.cpp's number (1) or None (unspecified)."""
    if value is None:
        return PoolingType.UNSPECIFIED
    if isinstance(value, str):
        try:
            return PoolingType[value.strip().upper()]
        except KeyError:
            raise ValueError(f"pooling must be one of {POOLING_NAMES}, got {value!r}") from None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        try:
            return PoolingType(int(value))
        except ValueError:
            raise ValueError(f"unknown pooling type {value} (llama.cpp's are -1 to 4)") from None
    raise TypeError(f"pooling must be a name or an int, not {type(value).__name__}")


def resolve(requested: str | int | None, hp: HParams) -> PoolingType:
    """The pooling a context uses: the requested one, else the model's, else none."""
    pooling = pooling_type(requested)
    if pooling is PoolingType.UNSPECIFIED:
        pooling = pooling_type(hp.pooling_type)
    return PoolingType.NONE if pooling is PoolingType.UNSPECIFIED else pooling


@dataclass(frozen=True)
class PoolingInputs:
    """What a pooling ubatch feeds its plan: the sequences it pools (ascending ids, as llama.cpp's
    ``seq_id_unq``) and, per sequence, the mean weights over the ubatch's tokens or the row taken."""

    seq_ids: np.ndarray              # int32 [n_seqs]
    mean: np.ndarray | None          # float32 [n_seqs, n_tokens]
    rows: np.ndarray | None          # int64 [n_seqs]


def pooling_inputs(pooling: PoolingType, seq_lists: Sequence[Sequence[int]], pos: np.ndarray,
                   causal: bool) -> PoolingInputs:
    """llama.cpp's ``llm_graph_input_mean`` / ``llm_graph_input_cls`` for one ubatch: a token of
    several sequences counts in each; CLS takes the lowest position of a sequence (the first such
    token), LAST the highest (the last such token), RANK the first, or the last when ``causal``."""
    seq_ids = np.array(sorted({s for seqs in seq_lists for s in seqs}), np.int32)
    index = {int(s): i for i, s in enumerate(seq_ids)}
    mean = rows = None
    # rank pooling takes the first token, or a mean where the model pools so before its head
    if pooling in (PoolingType.MEAN, PoolingType.RANK):
        mean = np.zeros((len(seq_ids), len(pos)), np.float32)
        for t, seqs in enumerate(seq_lists):
            for s in seqs:
                mean[index[s], t] = 1.0
        counts = mean.sum(axis=1, dtype=np.float64).astype(np.float32)
        mean *= (np.float32(1.0) / counts)[:, None]   # 1.0f/float(n), as llama.cpp
    if pooling in (PoolingType.CLS, PoolingType.LAST, PoolingType.RANK):
        last = pooling is PoolingType.LAST or (pooling is PoolingType.RANK and causal)
        target_pos = np.full(len(seq_ids), -1, np.int64)
        rows = np.zeros(len(seq_ids), np.int64)
        for t, seqs in enumerate(seq_lists):
            p = int(pos[t])
            for s in seqs:
                i = index[s]
                if target_pos[i] == -1 or (p >= target_pos[i] if last else p < target_pos[i]):
                    target_pos[i], rows[i] = p, t
    return PoolingInputs(seq_ids, mean, rows)

