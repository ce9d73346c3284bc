"""Hybrid memory: a KV cache for the attention layers and recurrent states for the others
(llama.cpp's ``llama_memory_hybrid``).

Hybrid models (Granite 4, Falcon-H1, Nemotron-H, Jamba, ...) mix layers that attend over a KV
cache with layers that keep a recurrent state per sequence. Which layers each part holds is the
architecture's choice (:meth:`gguflm.models.Architecture.attention_layers` and
``recurrent_layers``, llama.cpp's ``filter_attn`` / ``filter_recr``): by default the recurrent
layers are those of ``hparams.is_recurrent(il)`` and the others attend; Falcon-H1's layers do
both. The two parts are a :class:`gguflm.kv_cache.Memory` and a
:class:`gguflm.memory_recurrent.RecurrentMemory`, and every sequence operation goes to both, as
llama.cpp's:

- ``seq_rm`` asks the recurrent part first: if it refuses (a range that would leave a shorter
  past, ``seq_id < 0``), False and nothing changed; else the KV cache drops the range too.
- ``seq_cp``, ``seq_keep``, ``seq_add``, ``seq_div`` apply to both.
- ``seq_pos_min`` is the larger of the parts' minimums, ``seq_pos_max`` the smaller of their
  maximums (the positions both parts hold).

Batches are cut as llama.cpp cuts them for a hybrid memory: ``split_equal`` (every sequence of
a ubatch has as many tokens), in its sequential form (consecutive sequence ids) only when the KV
cache keeps one region per sequence (``kv_unified=False``), else by non-overlapping sequence sets
in batch order; ``split_seq`` when every token is an output. State files and session files hold
both parts (each cache of the context saves its own arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gguflm.kv_cache import KVCache, Memory, SequenceIds
from gguflm.memory_recurrent import RecurrentCache, RecurrentMemory


class HybridMemory(SequenceIds):
    """``ctx.memory`` of a hybrid model: ``attn`` (the KV caches of the attention layers) and
    ``recr`` (the recurrent states of the others).

    As llama.cpp's: ``p0 < 0`` means from the start, ``p1 < 0`` to the end; ids out of range
    raise ValueError as the other memories do.
    """

    def __init__(self, kv_caches: Sequence[KVCache], recurrent: RecurrentCache, n_seq_max: int):
        self.attn = Memory(kv_caches, n_seq_max)
        self.recr = RecurrentMemory(recurrent, n_seq_max)
        self.caches = [*kv_caches, recurrent]
        self.n_seq_max = n_seq_max

    def seq_pos_min(self, seq_id: int) -> int:
        """The first position both parts hold for ``seq_id`` (-1 if neither holds any)."""
        return max(self.attn.seq_pos_min(seq_id), self.recr.seq_pos_min(seq_id))

    def seq_pos_max(self, seq_id: int) -> int:
        """The last position both parts hold for ``seq_id`` (-1 if one of them holds none)."""
        return min(self.attn.seq_pos_max(seq_id), self.recr.seq_pos_max(seq_id))

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of ``seq_id`` from both parts; False, nothing changed, when
        the recurrent part cannot (see :meth:`RecurrentMemory.seq_rm`)."""
        if not self.recr.seq_rm(seq_id, p0, p1):
            return False
        return self.attn.seq_rm(seq_id, p0, p1)

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        self.attn.seq_cp(seq_id_src, seq_id_dst, p0, p1)
        self.recr.seq_cp(seq_id_src, seq_id_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.attn.seq_keep(seq_id)
        self.recr.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.attn.seq_add(seq_id, p0, p1, delta)
        self.recr.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self.attn.seq_div(seq_id, p0, p1, d)
        self.recr.seq_div(seq_id, p0, p1, d)

    def apply_shifts(self, rope: Callable[[np.ndarray, np.ndarray, int], None], n_threads: int) -> None:
        """Re-rotate the attention layers' K rows whose positions moved (the states hold none)."""
        self.attn.apply_shifts(rope, n_threads)

    def clear(self) -> None:
        self.attn.clear()
        self.recr.clear()

    @property
    def nbytes(self) -> int:
        return self.attn.nbytes + self.recr.nbytes
