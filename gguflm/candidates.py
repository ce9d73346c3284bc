"""The candidates array and the sampler interface every llama.cpp sampler shares.

:class:`TokenDataArray` is llama.cpp's ``llama_token_data_array`` (ids, logits, probabilities, the
selected index, whether sorted); :class:`Sampler` is its ``llama_sampler_i`` (``name``,
``apply``, ``accept``, ``reset``, ``clone``, ``sample``). The samplers themselves are in
:mod:`gguflm.samplers`, the grammar sampler in :mod:`gguflm.grammar.sampler`.
"""

from __future__ import annotations

import copy
import operator
from typing import Any, Protocol

import numpy as np

from gguflm._ext import sampling as kernels

_F32 = np.float32
_MAX_TOKENS = 2**31 - 1


class LogitsSource(Protocol):
    """Anything with llama.cpp's ``get_logits_ith``: a row of float32 logits or None."""

    def get_logits_ith(self, idx: int) -> np.ndarray | None: ...



class TokenDataArray:
    """Candidate tokens: ``ids`` (int32), ``logits`` (float32), ``p`` (float32), plus ``selected``
    (index of the chosen candidate, -1 = none), ``sorted`` (best logit first) and ``size``.

    The arrays are views of buffers that live as long as this object; samplers truncate by
    shrinking ``size`` and reorder in place, as llama.cpp mutates ``cur_p``. :meth:`load_logits`
    refills the same buffers for the next row, so a chain allocates nothing per token. After a
    load, ids 0..n-1 and zero probabilities are written only when something reads them: a
    top-k that keeps 40 of 262,144 candidates never writes the other ids.

    Parameters
    ----------
    ids, logits : array_like
        One entry per candidate (ids must fit int32).
    p : array_like, optional
        Probabilities; zeros when omitted.
    sorted : bool
        Whether the candidates are already in descending logit order.
    """

    __slots__ = ("_ids", "_logits", "_p", "_start", "_size", "selected", "sorted", "_positions",
                 "_scratch", "_arange", "_ids_pending", "_p_pending")

    def __init__(self, ids: Any, logits: Any, p: Any = None, *, sorted: bool = False) -> None:
        ids_in = _as_1d(ids, "ids")
        if ids_in.size and not np.issubdtype(ids_in.dtype, np.integer):
            raise TypeError(f"ids must be integers, got dtype {ids_in.dtype}")
        if ids_in.size and (ids_in.min() < -(2**31) or ids_in.max() > _MAX_TOKENS):
            raise ValueError("ids must fit in int32")
        logits_in = _as_1d(logits, "logits")
        p_in = np.zeros(len(logits_in), dtype=_F32) if p is None else _as_1d(p, "p")
        if not (len(ids_in) == len(logits_in) == len(p_in)):
            raise ValueError(f"ids, logits and p differ in length: "
                             f"{len(ids_in)}, {len(logits_in)}, {len(p_in)}")
        n = len(ids_in)
        self._allocate(n)
        self._ids[:n] = ids_in
        self._logits[:n] = logits_in
        self._p[:n] = p_in
        self._size = n
        self.selected = -1
        self.sorted = bool(sorted)

    @classmethod
    def from_logits(cls, logits: Any) -> TokenDataArray:
        """Candidates 0..n-1 for a row of logits (copied), p = 0, unsorted, nothing selected."""
        cur = cls.__new__(cls)
        cur._allocate(0)
        cur.load_logits(logits)
        return cur

    def load_logits(self, logits: Any) -> None:
        """Refill from a row of logits as :meth:`from_logits` does, reusing the buffers."""
        row = _as_1d(logits, "logits")
        n = len(row)
        if n > _MAX_TOKENS:
            raise ValueError(f"a row of {n} logits is more than int32 token ids can address")
        if n > len(self._ids):
            self._allocate(n)
        np.copyto(self._logits[:n], row, casting="same_kind")
        self._start = 0
        self._size = n
        self._ids_pending = True  # ids are 0..n-1, written on first read
        self._p_pending = True  # probabilities are 0, written on first read
        self.selected = -1
        self.sorted = False

    def _allocate(self, capacity: int) -> None:
        self._ids = np.empty(capacity, dtype=np.int32)  # [capacity]
        self._logits = np.empty(capacity, dtype=_F32)  # [capacity]
        self._p = np.empty(capacity, dtype=_F32)  # [capacity]
        self._positions = np.empty(capacity, dtype=np.int32)  # orderings, [capacity]
        self._scratch = np.empty(0, dtype=np.uint64)  # kernel scratch, 3 words a candidate
        self._arange = np.empty(0, dtype=np.int32)  # 0..capacity-1 once needed
        self._start = 0
        self._size = 0
        self._ids_pending = False
        self._p_pending = False

    # the current candidates --------------------------------------------------------------

    @property
    def ids(self) -> np.ndarray:
        """Token ids of the current candidates (a view)."""
        self._materialize()
        return self._ids[self._start:self._start + self._size]

    @property
    def logits(self) -> np.ndarray:
        """Logits of the current candidates (a view)."""
        return self._logits[self._start:self._start + self._size]

    @property
    def p(self) -> np.ndarray:
        """Probabilities of the current candidates (a view)."""
        self._materialize()
        return self._p_for_writing()

    @property
    def identity_ids(self) -> bool:
        """Whether candidate i is token i (the ids of a freshly loaded row, not yet reordered)."""
        return self._ids_pending and self._start == 0

    def _materialize(self) -> None:
        """Write the ids 0..n-1 and zero probabilities that a load left pending."""
        if self._ids_pending:
            if len(self._arange) < len(self._ids):
                self._arange = np.arange(len(self._ids), dtype=np.int32)
            self._ids[self._start:self._start + self._size] = self._arange[:self._size]
            self._ids_pending = False
        if self._p_pending:
            self._p_for_writing()[:] = 0.0
            self._p_pending = False

    def _p_for_writing(self) -> np.ndarray:
        """The probabilities' window for a kernel that overwrites all of it."""
        return self._p[self._start:self._start + self._size]

    @property
    def size(self) -> int:
        """Number of current candidates; assign a smaller value to truncate."""
        return self._size

    @size.setter
    def size(self, value: int) -> None:
        value = operator.index(value)
        if not 0 <= value <= self._size:
            raise ValueError(f"size can only shrink: 0..{self._size}, got {value}")
        self._size = value

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return (f"TokenDataArray(size={self._size}, selected={self.selected}, "
                f"sorted={self.sorted})")

    @property
    def selected_id(self) -> int:
        """Token id of the selected candidate; ValueError when none is selected."""
        if not 0 <= self.selected < self._size:
            raise ValueError(f"no candidate selected (selected={self.selected}, size={self._size})")
        if self._ids_pending:
            return self.selected
        return int(self._ids[self._start + self.selected])

    # operations the samplers share --------------------------------------------------------

    def _scratch_words(self) -> np.ndarray:
        need = 3 * len(self._ids)
        if len(self._scratch) < need:
            self._scratch = np.empty(need, dtype=np.uint64)
        return self._scratch

    def best_positions(self, k: int) -> np.ndarray:
        """Positions of the ``min(k, size)`` best candidates, best first, in the order llama.cpp's
        ``llama_token_data_array_partial_sort_inplace`` leaves them (ties included); nothing moves.

        The result is a view of an internal buffer, valid until the next call.
        """
        k = kernels.partial_sort_positions(self.logits, k, self._positions,
                                           self._scratch_words())
        return self._positions[:k]

    def sorted_positions(self, keys: np.ndarray) -> np.ndarray:
        """Positions of all candidates by descending ``keys`` as GCC's ``std::sort`` orders them
        (ties included, NaN last); a view like :meth:`best_positions`."""
        keys = np.ascontiguousarray(keys, dtype=_F32)
        if len(keys) != self._size:
            raise ValueError(f"{len(keys)} keys for {self._size} candidates")
        kernels.sort_positions(keys, self._positions, self._scratch_words())
        return self._positions[:self._size]

    def keep_positions(self, positions: np.ndarray) -> None:
        """Make the candidates at ``positions`` (in that order) the whole array."""
        positions = np.ascontiguousarray(positions, dtype=np.int32)
        kernels.take_prefix(self._ids[self._start:self._start + self._size], self.logits,
                    self._p_for_writing(), positions, self._scratch_words(),
                    self._ids_pending, self._p_pending)
        self._ids_pending = self._p_pending = False
        self._size = len(positions)

    def keep_best(self, k: int) -> None:
        """Partial sort: keep the ``k`` best candidates, best first, and mark the array sorted."""
        self.keep_positions(self.best_positions(k))
        self.sorted = True

    def drop_front(self, n: int) -> None:
        """Remove the first ``n`` candidates (llama.cpp advances its data pointer)."""
        if not 0 <= n <= self._size:
            raise ValueError(f"cannot drop {n} of {self._size} candidates")
        self._materialize()  # pending ids and probabilities are relative to the window start
        self._start += n
        self._size -= n

    def positions_of(self, tokens: np.ndarray) -> np.ndarray:
        """Positions of sorted, distinct ``tokens`` among the candidates (-1 where absent)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if self._ids_pending:  # ids are 0..size-1
            return np.where((tokens >= 0) & (tokens < self._size), tokens, -1).astype(np.int32)
        in_range = (tokens >= -(2**31)) & (tokens <= _MAX_TOKENS)
        out = np.full(len(tokens), -1, dtype=np.int32)
        found = np.empty(int(in_range.sum()), dtype=np.int32)
        wanted = np.ascontiguousarray(tokens[in_range], dtype=np.int32)
        kernels.find_token_positions(self.ids, wanted, found)
        out[in_range] = found
        return out

    def at_own_index(self, tokens: np.ndarray) -> np.ndarray:
        """For each token t, whether candidate t has id t (llama.cpp's logit-bias shortcut)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        mask = (tokens >= 0) & (tokens < self._size)
        if not self._ids_pending:
            mask[mask] = self.ids[tokens[mask]] == tokens[mask]
        return mask

    def softmax(self, do_sort: bool) -> None:
        """llama.cpp's ``llama_sampler_softmax_impl``: optionally sort, then p = softmax(logits)."""
        if self._size == 0:
            return
        if do_sort and not self.sorted:
            self.keep_best(self._size)
        kernels.softmax(self.logits, self._p_for_writing(), self.sorted)
        self._p_pending = False

    def dist_select(self, rnd: float) -> None:
        """llama.cpp's dist draw for at least two candidates: p = softmax, select by ``rnd``."""
        self.selected = kernels.dist_select(self.logits, self._p_for_writing(), self.sorted, rnd)
        self._p_pending = False



def _as_1d(values: Any, what: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {array.shape}")
    return array


class Sampler:
    """Base of every sampler: llama.cpp's ``llama_sampler_i`` as a Python class."""

    #: llama.cpp's name for the sampler
    name = "sampler"

    def apply(self, cur_p: TokenDataArray) -> None:
        """Filter, reorder, rescale or select among ``cur_p`` in place."""
        raise NotImplementedError

    def accept(self, token: int) -> None:
        """Remember ``token`` as generated (only stateful samplers care)."""

    def reset(self) -> None:
        """Forget history and restart random streams from the seed."""

    def clone(self) -> Sampler:
        """An independent sampler in the same state."""
        return copy.deepcopy(self)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_cur", None)  # the candidates buffer of sample() is not state
        return state

    def sample(self, ctx: LogitsSource, idx: int = -1) -> int:
        """llama.cpp's ``llama_sampler_sample``: candidates from ``ctx.get_logits_ith(idx)``,
        :meth:`apply`, then :meth:`accept` the selected token and return it.

        Raises
        ------
        ValueError
            When the context has no logits row for ``idx``, or nothing was selected.
        """
        cur_p = self._candidates(ctx, idx)
        self.apply(cur_p)
        token = self._selected(cur_p)
        self.accept(token)
        return token

    def _candidates(self, ctx: LogitsSource, idx: int) -> TokenDataArray:
        """All of row ``idx``'s logits as candidates, in a buffer kept between calls."""
        row = ctx.get_logits_ith(idx)
        if row is None:
            raise ValueError(f"the context has no logits for index {idx}")
        cur_p = self.__dict__.get("_cur")
        if cur_p is None:
            cur_p = self._cur = TokenDataArray.from_logits(row)
        else:
            cur_p.load_logits(row)
        return cur_p

    def _selected(self, cur_p: TokenDataArray) -> int:
        if not 0 <= cur_p.selected < cur_p.size:
            raise ValueError(f"{self.name}: no token was selected; end the chain with a sampler "
                             f"that selects one (Greedy, Dist, Mirostat, MirostatV2)")
        return cur_p.selected_id

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"
