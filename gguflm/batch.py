"""Batches: the tokens (or embeddings), positions, sequence ids and output flags of one decode call.

Like llama.cpp's ``llama_batch``: fields left as ``None`` (as :meth:`Batch.get_one` does) are
filled in by the context: positions continue each sequence, the sequence is 0, and only the last
token asks for output (every token when the context computes embeddings).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

import numpy as np

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class Batch:
    """Room for ``n_tokens_max`` tokens; ``embd > 0`` makes it carry embeddings instead of ids.

    The numpy fields may be filled in bulk; ``n_tokens`` says how many entries are in use.

    Attributes
    ----------
    token : np.ndarray[int32] [n_tokens_max] or None
    embd : np.ndarray[float32] [n_tokens_max, embd] or None
    pos : np.ndarray[int32] [n_tokens_max] or None (left to the context)
    n_seq_id : np.ndarray[int32] [n_tokens_max] or None
    seq_id : np.ndarray[int32] [n_tokens_max, n_seq_max] or None
    logits : np.ndarray[int8] [n_tokens_max] or None (1 = this token wants output)
    """

    def __init__(self, n_tokens_max: int, embd: int = 0, n_seq_max: int = 1):
        if n_tokens_max < 1:
            raise ValueError(f"n_tokens_max must be >= 1, got {n_tokens_max}")
        if embd < 0 or n_seq_max < 1:
            raise ValueError("embd must be >= 0 and n_seq_max >= 1")
        self.n_tokens_max = n_tokens_max
        self.n_seq_max = n_seq_max
        self.n_tokens = 0
        self.token: np.ndarray | None = None if embd else np.zeros(n_tokens_max, np.int32)
        self.embd: np.ndarray | None = np.zeros((n_tokens_max, embd), np.float32) if embd else None
        self.pos: np.ndarray | None = np.zeros(n_tokens_max, np.int32)
        self.n_seq_id: np.ndarray | None = np.zeros(n_tokens_max, np.int32)
        self.seq_id: np.ndarray | None = np.zeros((n_tokens_max, n_seq_max), np.int32)
        self.logits: np.ndarray | None = np.zeros(n_tokens_max, np.int8)

    @classmethod
    def get_one(cls, tokens: Sequence[int] | np.ndarray) -> Batch:
        """A batch of ``tokens`` for sequence 0 whose positions and outputs the context decides."""
        ids = np.asarray(tokens)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError("get_one needs a non-empty 1-D sequence of token ids")
        if ids.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, got {ids.dtype}")
        ids = ids.astype(np.int64)
        if ids.min() < _INT32_MIN or ids.max() > _INT32_MAX:
            raise ValueError("token ids must fit in int32")
        batch = cls(len(ids))
        batch.token[:] = ids
        batch.n_tokens = len(ids)
        batch.pos = batch.n_seq_id = batch.seq_id = batch.logits = None
        return batch

    def add(self, token: int | np.ndarray, pos: int, seq_ids: Iterable[int], logits: bool) -> None:
        """Append one token (an id, or an embedding row when the batch carries embeddings)."""
        if self.n_tokens >= self.n_tokens_max:
            raise ValueError(f"batch is full ({self.n_tokens_max} tokens)")
        if self.pos is None or self.seq_id is None or self.n_seq_id is None or self.logits is None:
            raise ValueError("cannot add to a batch made by get_one")
        seqs = list(seq_ids)
        if not 1 <= len(seqs) <= self.n_seq_max:
            raise ValueError(f"a token needs 1 to {self.n_seq_max} sequence ids, got {len(seqs)}")
        i = self.n_tokens
        if self.token is not None:
            self.token[i] = operator.index(token)  # an int, never a truncated float
        else:
            self.embd[i] = np.asarray(token, dtype=np.float32)
        self.pos[i] = pos
        self.n_seq_id[i] = len(seqs)
        self.seq_id[i, : len(seqs)] = seqs
        self.logits[i] = 1 if logits else 0
        self.n_tokens = i + 1

    def clear(self) -> None:
        self.n_tokens = 0

    def __len__(self) -> int:
        return self.n_tokens

    def __repr__(self) -> str:
        kind = "embd" if self.embd is not None else "tokens"
        return f"Batch({self.n_tokens}/{self.n_tokens_max} {kind})"
