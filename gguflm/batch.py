"""Batches: the tokens (or embeddings), positions, sequence ids and output flags of one decode call,
and their way to the forward pass.

:class:`Batch` is llama.cpp's ``llama_batch``: fields left as ``None`` (as :meth:`Batch.get_one`
does) are filled in by the context: positions continue each sequence, the sequence is 0, and only
the last token asks for output (every token when the context computes embeddings).
:class:`BatchAllocator` is llama.cpp's ``llama_batch_allocr``: it checks a batch against the
context's memory and hyper-parameters, fills in what the batch leaves out (:meth:`~BatchAllocator.init`)
and cuts it into :class:`UBatch` objects of at most ``n_ubatch`` tokens (:meth:`~BatchAllocator.split`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gguflm.errors import Error
from gguflm.pooling import PoolingType, pooling_inputs

if TYPE_CHECKING:
    from gguflm.hparams import HParams
    from gguflm.kv_cache import Memory

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


class InvalidBatchError(Error):
    """Why decode returned -1 (logged, not raised, by decode)."""


@dataclass
class PreparedBatch:
    """A checked batch with every field filled in (llama.cpp's ``llama_batch_allocr`` after init)."""

    tokens: np.ndarray | None   # int32 [n_tokens] (None when embeddings are given)
    embd: np.ndarray | None     # float32 [n_tokens, n_embd]
    pos: np.ndarray             # int32 [n_tokens]
    seq_first: np.ndarray       # int32 [n_tokens]: each token's first sequence
    seq_mask: np.ndarray        # uint64 [n_tokens]: all its sequences as bits (caches only)
    seq_lists: list[list[int]]  # its sequences, as the batch lists them
    output: np.ndarray          # bool [n_tokens]


@dataclass
class UBatch:
    """One ubatch, as the context hands it to a plan (llama.cpp's ``llama_ubatch``)."""

    tokens: np.ndarray | None            # int32 [n_tokens] (None when embeddings are given)
    embd: np.ndarray | None              # float32 [n_tokens, n_embd]
    pos: np.ndarray                      # int32 [n_tokens]
    seq_first: np.ndarray                # int32 [n_tokens]: the token's first sequence (masks)
    seq_mask: np.ndarray                 # uint64 [n_tokens]: all its sequences (cache cells)
    output_rows: np.ndarray              # int64 [n_outputs]: rows that produce output
    cells: dict[int, np.ndarray] = field(default_factory=dict)  # cache index → cells
    pooling: Any = None                  # gguflm.pooling.PoolingInputs of a pooling context
    batch_rows: np.ndarray | None = None  # int64 [n_tokens]: each token's index in the batch (None: in order from ``first``)
    n_rs_seqs: int = 0                   # an equal split's sequences (as many tokens each), else 0
    per_token: bool = False              # each token rounds as in a one-token ubatch (drafts checked)

    @property
    def n_tokens(self) -> int:
        return len(self.pos)

    @property
    def n_outputs(self) -> int:
        return len(self.output_rows)

    @property
    def n_seqs(self) -> int:
        """Sequences pooled in this ubatch (0 without pooling)."""
        return 0 if self.pooling is None else len(self.pooling.seq_ids)

    @property
    def shape(self) -> tuple[int, int, bool, int, int, bool]:
        return self.n_tokens, self.n_outputs, self.tokens is None, self.n_seqs, self.n_rs_seqs, self.per_token


@dataclass(frozen=True)
class OneToken:
    """A one-token batch of one sequence, checked on Python ints (a generation step)."""

    token: int
    pos: int
    seq: int
    output: bool


class BatchAllocator:
    """Checks batches against a context's memory and hyper-parameters and cuts them into ubatches.

    Parameters
    ----------
    hparams
        The model's hyper-parameters (``n_vocab``, ``n_embd``, ``causal_attn``).
    max_positions
        How many positions the model embeds (absolute positions), or None.
    memory
        The context's caches (``seq_pos_max``); ``has_cache`` False for an encoder's context, whose
        memory holds no cells: every batch must then fit one ubatch, and positions go unchecked.
    n_seq_max, n_batch, n_ubatch
        The context's limits.
    output_all
        Every token is an output (a context that computes embeddings).
    pooling
        The context's pooling type, where it pools (else None): each ubatch then carries the
        pooling inputs of its sequences.
    equal_split
        Cut batches as a recurrent memory needs them (:meth:`split_equal`): every sequence of a
        ubatch has as many tokens.
    sequential
        With ``equal_split``: a ubatch's sequences have consecutive ids (a recurrent memory's,
        or a hybrid one's whose KV cache keeps a region per sequence), else any sequence sets
        that do not overlap (a hybrid memory's with a unified KV cache).
    """

    def __init__(self, hparams: HParams, max_positions: int | None, memory: Memory, has_cache: bool,
                 n_seq_max: int, n_batch: int, n_ubatch: int, output_all: bool,
                 pooling: PoolingType | None, equal_split: bool = False, sequential: bool = True) -> None:
        self.hparams = hparams
        self.max_positions = max_positions
        self.memory = memory
        self.has_cache = has_cache
        self.n_seq_max = n_seq_max
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.output_all = output_all
        self.pooling = pooling
        self.equal_split = equal_split
        self.sequential = sequential

    def init(self, batch: Batch) -> PreparedBatch:
        """The batch checked and completed; raises :class:`InvalidBatchError` (decode's -1)."""
        hp = self.hparams
        n = batch.n_tokens
        if n <= 0:
            raise InvalidBatchError("n_tokens == 0")
        if n > self.n_batch:
            raise InvalidBatchError(f"n_tokens = {n} > n_batch = {self.n_batch}")
        tokens = embd = None
        if batch.token is not None:
            tokens = np.ascontiguousarray(batch.token[:n], dtype=np.int32)
            if tokens.min() < 0 or tokens.max() >= hp.n_vocab:
                bad = np.flatnonzero((tokens < 0) | (tokens >= hp.n_vocab))
                raise InvalidBatchError(f"invalid token[{bad[0]}] = {tokens[bad[0]]} (n_vocab = {hp.n_vocab})")
        else:
            embd = np.ascontiguousarray(batch.embd[:n], dtype=np.float32)
            if embd.shape[1] != hp.n_embd:
                raise InvalidBatchError(f"embeddings have {embd.shape[1]} values, the model {hp.n_embd}")

        # sequences: first id (for masks) and the full set (bits for cache cells, lists for pooling)
        if batch.seq_id is None:
            seq_first = np.zeros(n, np.int32)
            seq_mask = np.ones(n, np.uint64)
            seq_lists = [[0]] * n
        else:
            n_seq = batch.n_seq_id[:n]
            if (n_seq < 1).any() or (n_seq > batch.seq_id.shape[1]).any():
                raise InvalidBatchError("every token needs at least one sequence id")
            seq_lists = [[int(s) for s in batch.seq_id[i, : n_seq[i]]] for i in range(n)]
            for i, seqs in enumerate(seq_lists):
                for s in seqs:
                    if not 0 <= s < self.n_seq_max:
                        raise InvalidBatchError(f"invalid seq_id[{i}] = {s} >= n_seq_max ({self.n_seq_max})")
            seq_first = np.array([seqs[0] for seqs in seq_lists], np.int32)
            seq_mask = np.array([sum(1 << s for s in set(seqs)) for seqs in seq_lists], np.uint64) \
                if self.has_cache else np.zeros(n, np.uint64)

        # positions: continue each sequence when the batch leaves them out (a batch of sequence
        # 0 alone, as get_one makes, then continues it by construction and needs no check)
        if batch.pos is None and batch.seq_id is None:
            start = self.memory.seq_pos_max(0) + 1
            pos = np.arange(start, start + n, dtype=np.int32)
        else:
            if batch.pos is None:
                next_pos = {s: self.memory.seq_pos_max(s) + 1 for s in range(self.n_seq_max)}
                pos = np.empty(n, np.int32)
                for i, seqs in enumerate(seq_lists):
                    pos[i] = next_pos[seqs[0]]
                    for s in seqs:
                        next_pos[s] = pos[i] + 1
            else:
                pos = np.ascontiguousarray(batch.pos[:n], dtype=np.int32)
            self._check_positions(pos, seq_mask)
        limit = self.max_positions
        if limit is not None and pos.max() >= limit:
            raise InvalidBatchError(f"position {pos.max()} is past the {limit} positions the model embeds")
        if not self.has_cache and n > self.n_ubatch:
            # llama.cpp's encode: no cache to carry a batch over, so one ubatch holds it all
            raise InvalidBatchError(f"an encoder needs the whole batch in one ubatch: n_tokens = {n} > "
                                    f"n_ubatch = {self.n_ubatch}")

        if batch.logits is None or self.output_all:
            # embeddings make every token an output, as llama.cpp's output_all
            output = np.ones(n, bool) if self.output_all else np.zeros(n, bool)
            output[-1] = True
        else:
            output = batch.logits[:n] != 0
        return PreparedBatch(tokens, embd, pos, seq_first, seq_mask, seq_lists, output)

    def _check_positions(self, pos: np.ndarray, seq_mask: np.ndarray) -> None:
        """Given positions must continue each sequence the cache holds, without gaps or repeats."""
        if (pos < 0).any():
            raise InvalidBatchError("positions must be >= 0")
        if not self.has_cache:
            return  # nothing stored to continue: llama.cpp's encode does not check positions
        for s in range(self.n_seq_max):
            in_s = (seq_mask >> np.uint64(s)) & np.uint64(1) == 1
            if not in_s.any():
                continue
            p = pos[in_s]
            last = self.memory.seq_pos_max(s)
            if last >= 0 and p.min() != last + 1:
                raise InvalidBatchError(
                    f"the tokens of sequence {s} in the input batch have inconsistent sequence "
                    f"positions: the last position stored in the memory is {last}, the first in "
                    f"the batch is {p.min()}; they must be consecutive")
            if p.max() - p.min() + 1 > len(p) or len(np.unique(p)) != len(p):
                raise InvalidBatchError(f"the positions of sequence {s} in the batch are not continuous")

    def one_token(self, batch: Batch) -> OneToken | None:
        """A one-token batch of one sequence of a context with a cache that continues its
        sequence, checked as :meth:`init` checks it but on Python ints (a generation step); None
        for any other batch, valid or not (:meth:`init` takes those, and reports the invalid)."""
        if batch.n_tokens != 1 or batch.token is None or self.output_all or not self.has_cache:
            return None
        tok = int(batch.token[0])
        if batch.seq_id is None:
            seq = 0
        elif batch.n_seq_id is not None and int(batch.n_seq_id[0]) == 1:
            seq = int(batch.seq_id[0, 0])
        else:
            return None
        if not 0 <= tok < self.hparams.n_vocab or not 0 <= seq < self.n_seq_max:
            return None
        last = self.memory.seq_pos_max(seq)
        pos = last + 1 if batch.pos is None else int(batch.pos[0])
        limit = self.max_positions
        if pos < 0 or (last >= 0 and pos != last + 1) or (limit is not None and pos >= limit):
            return None
        return OneToken(tok, pos, seq, batch.logits is None or bool(batch.logits[0] != 0))

    def split(self, b: PreparedBatch) -> list[UBatch]:
        """``b`` cut into ubatches of at most ``n_ubatch`` tokens, in order (llama.cpp's
        ``split_simple``), or as a recurrent memory needs (``equal_split``: :meth:`split_equal`,
        :meth:`split_seq` when every token is an output). An empty list: the batch cannot be cut
        so (decode's 1, as llama.cpp's failed memory slot)."""
        if self.equal_split:
            return self.split_seq(b) if self.output_all else self.split_equal(b)
        ubatches = []
        causal = self.has_cache and self.hparams.causal_attn
        for start in range(0, len(b.pos), self.n_ubatch):
            sl = slice(start, start + self.n_ubatch)
            pos = b.pos[sl]
            ubatches.append(UBatch(
                tokens=None if b.tokens is None else b.tokens[sl],
                embd=None if b.embd is None else b.embd[sl],
                pos=pos, seq_first=b.seq_first[sl], seq_mask=b.seq_mask[sl],
                output_rows=np.flatnonzero(b.output[sl]),
                pooling=None if self.pooling is None else pooling_inputs(self.pooling, b.seq_lists[sl], pos, causal)))
        return ubatches

    def _ubatch(self, b: PreparedBatch, rows: list[int], n_seqs: int) -> UBatch:
        """The tokens ``rows`` of ``b`` (batch indices, in ubatch order: ``n_seqs`` sequences
        of as many tokens each) as one ubatch."""
        idx = np.asarray(rows, np.int64)
        causal = self.has_cache and self.hparams.causal_attn
        pos = b.pos[idx]
        return UBatch(tokens=None if b.tokens is None else b.tokens[idx], embd=None if b.embd is None else b.embd[idx],
                      pos=pos, seq_first=b.seq_first[idx], seq_mask=b.seq_mask[idx],
                      output_rows=np.flatnonzero(b.output[idx]), batch_rows=idx, n_rs_seqs=n_seqs,
                      pooling=None if self.pooling is None else
                      pooling_inputs(self.pooling, [b.seq_lists[i] for i in rows], pos, causal))

    def split_equal(self, b: PreparedBatch) -> list[UBatch]:
        """llama.cpp's ``split_equal``: each ubatch takes the sequence sets (the sequences of a
        token) of the unused tokens in batch order, at most n_ubatch + 1 of them, that overlap
        none already taken (``sequential``: single sequences of consecutive ids starting with
        the first unused token's), and from each the same number of its next tokens, as many as
        n_ubatch allows. In the sequential form a token of several sequences cannot be split
        so: then no ubatch (llama.cpp refuses coupled sequences there)."""
        if self.sequential and any(len(set(seqs)) > 1 for seqs in b.seq_lists):
            return []
        n = len(b.pos)
        masks = b.seq_mask.tolist()
        firsts = b.seq_first.tolist()
        by_set: dict[int, list[int]] = {}
        for i, m in enumerate(masks):
            by_set.setdefault(m, []).append(i)
        taken = dict.fromkeys(by_set, 0)   # tokens of each sequence set already in a ubatch
        used = np.zeros(n, bool)
        ubatches = []
        while True:
            sets: list[int] = []
            last_first = -1
            for i in np.flatnonzero(~used).tolist():
                m = masks[i]
                if any(m & other for other in sets):
                    continue
                if self.sequential and sets and firsts[i] != last_first + 1:
                    continue
                sets.append(m)
                last_first = firsts[i]
                if len(sets) > self.n_ubatch:
                    break
            if not sets:
                return ubatches
            per_set: list[list[int]] = [[] for _ in sets]
            while all(taken[m] < len(by_set[m]) for m in sets):
                for k, m in enumerate(sets):
                    per_set[k].append(by_set[m][taken[m]])
                    taken[m] += 1
                if (len(per_set[0]) + 1) * len(sets) > self.n_ubatch:
                    break
            rows = [i for part in per_set for i in part]
            used[rows] = True
            ubatches.append(self._ubatch(b, rows, len(sets)))

    def split_seq(self, b: PreparedBatch) -> list[UBatch]:
        """llama.cpp's ``split_seq``: ubatches of one sequence set each, the first unused token's,
        then the following tokens whose sequences are within it, up to n_ubatch."""
        n = len(b.pos)
        masks = b.seq_mask.tolist()
        used = np.zeros(n, bool)
        ubatches = []
        while not used.all():
            i = int(np.argmin(used))
            cur, rows = masks[i], []
            while True:
                rows.append(i)
                used[i] = True
                if len(rows) >= self.n_ubatch:
                    break
                i += 1
                while i < n and (used[i] or cur & masks[i] != masks[i]):
                    i += 1
                if i == n:
                    break
                cur = masks[i]
            ubatches.append(self._ubatch(b, rows, 1))
        return ubatches
