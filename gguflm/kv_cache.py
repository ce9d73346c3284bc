"""The KV cache: per-layer K and V rows stored in cells, and the cell bookkeeping.

A cell holds one token's K and V for every layer of its cache, its position and the set of
sequences it belongs to (a bit mask, so one prompt can be shared by several sequences). As in
llama.cpp's ``llama_kv_cache``: a ubatch takes free cells found from a moving head; cells are
freed by ``seq_rm``; position shifts (``seq_add``/``seq_div``) are recorded per cell and applied
to K (re-rotated with RoPE) before the next decode. Models with sliding-window layers get a
second, window-sized cache for those layers whose cells are reused once they slide out of every
window (``Memory`` dispatches to both).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gguflm.errors import StateError
from gguflm.kv_store import RowStore


@dataclass
class Slot:
    """The cells one ubatch will occupy, and what they held before (to roll back)."""

    cells: np.ndarray          # int64 [n_tokens]
    old_pos: np.ndarray        # int32 [n_tokens]
    old_seq: np.ndarray        # uint64 [n_tokens]


class KVCache:
    """One cache: ``size`` cells for the layers ``layers`` (model layer indices).

    ``k[il]``/``v[il]`` are [size, n_embd_{k,v}_gqa(il)] arrays of the cache type; ``n_swa > 0``
    makes cells reusable once their position is outside the window of their sequence.
    """

    def __init__(self, size: int, layers: Sequence[int], n_embd_k: Callable[[int], int],
                 n_embd_v: Callable[[int], int], type_k: str, type_v: str, n_seq_max: int,
                 n_swa: int = 0):
        self.size = size
        self.layers = list(layers)
        self.n_seq_max = n_seq_max
        self.n_swa = n_swa
        self.pos = np.full(size, -1, np.int32)
        self.seq = np.zeros(size, np.uint64)
        self.shift = np.zeros(size, np.int32)
        self.head = 0
        self.k = {il: RowStore(type_k, size, n_embd_k(il)) for il in self.layers}
        self.v = {il: RowStore(type_v, size, n_embd_v(il)) for il in self.layers}

    def commit(self) -> None:
        """Write every row once, making the cache resident (zeroed allocations are only mapped)."""
        for store in (*self.k.values(), *self.v.values()):
            store.clear()

    # -- sizes

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.k.values()) + sum(s.nbytes for s in self.v.values())

    @property
    def n_used(self) -> int:
        return int(np.count_nonzero(self.pos >= 0))

    @property
    def used_max_p1(self) -> int:
        """One past the highest occupied cell: attention scans cells [0, used_max_p1)."""
        used = np.flatnonzero(self.pos >= 0)
        return int(used[-1]) + 1 if len(used) else 0

    # -- sequences

    def _has(self, seq_id: int) -> np.ndarray:
        return ((self.seq >> np.uint64(seq_id)) & np.uint64(1)).astype(bool)

    def _in_range(self, p0: int, p1: int) -> np.ndarray:
        p0 = 0 if p0 < 0 else p0
        p1 = np.iinfo(np.int32).max if p1 < 0 else p1
        return (self.pos >= p0) & (self.pos < p1)

    def seq_pos_min(self, seq_id: int) -> int:
        sel = self._has(seq_id)
        return int(self.pos[sel].min()) if sel.any() else -1

    def seq_pos_max(self, seq_id: int) -> int:
        sel = self._has(seq_id)
        return int(self.pos[sel].max()) if sel.any() else -1

    def _clear_cells(self, sel: np.ndarray) -> None:
        self.pos[sel] = -1
        self.seq[sel] = 0
        self.shift[sel] = 0

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> None:
        sel = self._in_range(p0, p1)
        if seq_id < 0:
            self._clear_cells(sel)
            return
        sel &= self._has(seq_id)
        self.seq[sel] &= ~np.uint64(1 << seq_id)
        self._clear_cells(sel & (self.seq == 0))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        sel = self._in_range(p0, p1) & self._has(src)
        self.seq[sel] |= np.uint64(1 << dst)

    def seq_keep(self, seq_id: int) -> None:
        keep = self._has(seq_id)
        self.seq[keep] = np.uint64(1 << seq_id)
        self._clear_cells(~keep & (self.pos >= 0))

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        if delta == 0:
            return
        sel = self._in_range(p0, p1) & self._has(seq_id)
        self.pos[sel] += delta
        self.shift[sel] += delta
        self._clear_cells(sel & (self.pos < 0))

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        if d == 1:
            return
        sel = self._in_range(p0, p1) & self._has(seq_id)
        new = self.pos[sel] // d
        self.shift[sel] += new - self.pos[sel]
        self.pos[sel] = new

    def clear(self) -> None:
        self._clear_cells(np.ones(self.size, bool))
        self.head = 0
        for store in (*self.k.values(), *self.v.values()):
            store.clear()

    # -- placing ubatches

    def _reusable(self) -> np.ndarray:
        """Cells a new token may take: empty, or (window caches) slid out of their sequence's window."""
        free = self.pos < 0
        if self.n_swa > 0:
            single = (self.seq != 0) & ((self.seq & (self.seq - np.uint64(1))) == 0)
            if single.any():
                seq_of = np.zeros(self.size, np.int64)
                seq_of[single] = np.log2(self.seq[single].astype(np.float64)).astype(np.int64)
                pos_max = np.full(self.n_seq_max, -1, np.int64)
                np.maximum.at(pos_max, seq_of[single], self.pos[single].astype(np.int64))
                free |= single & (pos_max[seq_of] + 1 - self.pos >= self.n_swa)
        return free

    def find_slot(self, n_tokens: int) -> np.ndarray | None:
        """Cells for ``n_tokens`` new tokens, searched from the head (wrapping), or None."""
        if n_tokens > self.size:
            return None
        head = self.head
        if head > self.n_used + 2 * n_tokens:  # enough room before the head: refill from 0
            head = 0
        reusable = self._reusable()
        free = np.flatnonzero(reusable[head:]) + head
        if len(free) < n_tokens:
            free = np.concatenate([free, np.flatnonzero(reusable[:head])])
            if len(free) < n_tokens:
                return None
        return free[:n_tokens]

    def apply(self, cells: np.ndarray, pos: np.ndarray, seq_mask: np.ndarray) -> Slot:
        """Occupy ``cells`` with tokens at ``pos`` in sequences ``seq_mask``; returns the undo."""
        slot = Slot(cells, self.pos[cells].copy(), self.seq[cells].copy())
        overwritten = self.pos[cells] >= 0
        if overwritten.any():
            # cells reused from the window: older positions of their sequences go as well
            for c in cells[overwritten]:
                seq_bits, p = int(self.seq[c]), int(self.pos[c])
                for s in range(self.n_seq_max):
                    if seq_bits >> s & 1:
                        self.seq_rm(s, -1, p + 1)
        self.pos[cells] = pos
        self.seq[cells] = seq_mask
        self.shift[cells] = 0
        self.head = int(cells[-1]) + 1 if len(cells) else self.head
        if self.head >= self.size:
            self.head = 0
        return slot

    def undo(self, slot: Slot) -> None:
        self.pos[slot.cells] = slot.old_pos
        self.seq[slot.cells] = slot.old_seq

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        return self.pos.copy(), self.seq.copy(), self.shift.copy(), self.head

    def restore(self, snap: tuple[np.ndarray, np.ndarray, np.ndarray, int]) -> None:
        self.pos[:], self.seq[:], self.shift[:] = snap[0], snap[1], snap[2]
        self.head = snap[3]

    # -- state

    def state_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        used = np.flatnonzero(self.pos >= 0)
        arrays = {f"{prefix}cells": used, f"{prefix}pos": self.pos[used], f"{prefix}seq": self.seq[used],
                  f"{prefix}shift": self.shift[used], f"{prefix}head": np.array([self.head])}
        for il in self.layers:
            arrays[f"{prefix}k{il}"] = self.k[il].rows(used)
            arrays[f"{prefix}v{il}"] = self.v[il].rows(used)
        return arrays

    def load_state_arrays(self, prefix: str, arrays: dict[str, np.ndarray]) -> None:
        try:
            used = arrays[f"{prefix}cells"]
            if len(used) and (used.min() < 0 or used.max() >= self.size):
                raise StateError(f"saved state uses cells beyond this cache's {self.size}")
            rows = {il: (arrays[f"{prefix}k{il}"], arrays[f"{prefix}v{il}"]) for il in self.layers}
            for il, (k, v) in rows.items():
                self.k[il].check_rows(k, len(used))
                self.v[il].check_rows(v, len(used))
            self.clear()
            self.pos[used] = arrays[f"{prefix}pos"]
            self.seq[used] = arrays[f"{prefix}seq"]
            self.shift[used] = arrays[f"{prefix}shift"]
            self.head = int(arrays[f"{prefix}head"][0])
            for il, (k, v) in rows.items():
                self.k[il].set_rows(used, k)
                self.v[il].set_rows(used, v)
        except KeyError as exc:
            raise StateError(f"saved state lacks {exc}") from None


def save_arrays(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def load_arrays(data: bytes) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except Exception as exc:  # not an npz, truncated, …
        raise StateError(f"not a gguflm state: {exc}") from None


class Memory:
    """``ctx.memory``: the sequence operations of llama.cpp's memory API over the context's caches.

    Positions and sequence ids follow llama.cpp: ``p0 < 0`` means from the start, ``p1 < 0`` to
    the end, ``seq_id < 0`` (in ``seq_rm``) every sequence.
    """

    def __init__(self, caches: Sequence[KVCache], n_seq_max: int):
        self.caches = list(caches)
        self.n_seq_max = n_seq_max

    def _check_seq(self, seq_id: int, allow_all: bool = False) -> None:
        if not (allow_all and seq_id < 0) and not 0 <= seq_id < self.n_seq_max:
            raise ValueError(f"sequence id {seq_id} out of range [0, {self.n_seq_max})")

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position of ``seq_id`` in the cache, -1 if it holds none."""
        self._check_seq(seq_id)
        values = [c.seq_pos_min(seq_id) for c in self.caches]
        values = [v for v in values if v >= 0]
        return max(values) if values else -1

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of ``seq_id`` in the cache, -1 if it holds none."""
        self._check_seq(seq_id)
        return max((c.seq_pos_max(seq_id) for c in self.caches), default=-1)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of ``seq_id`` (every sequence if ``seq_id < 0``)."""
        self._check_seq(seq_id, allow_all=True)
        for c in self.caches:
            c.seq_rm(seq_id, p0, p1)
        return True

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        """Make positions [p0, p1) of ``seq_id_src`` also belong to ``seq_id_dst`` (no copy)."""
        self._check_seq(seq_id_src)
        self._check_seq(seq_id_dst)
        if seq_id_src != seq_id_dst:
            for c in self.caches:
                c.seq_cp(seq_id_src, seq_id_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        """Drop every sequence but ``seq_id``."""
        self._check_seq(seq_id)
        for c in self.caches:
            c.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions [p0, p1) of ``seq_id`` by ``delta``; K is re-rotated before the next decode."""
        self._check_seq(seq_id)
        for c in self.caches:
            c.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        """Divide positions [p0, p1) of ``seq_id`` by ``d`` (integer division)."""
        self._check_seq(seq_id)
        if d < 1:
            raise ValueError(f"divisor must be >= 1, got {d}")
        for c in self.caches:
            c.seq_div(seq_id, p0, p1, d)

    def clear(self) -> None:
        """Empty every cache (and zero its data)."""
        for c in self.caches:
            c.clear()

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)
