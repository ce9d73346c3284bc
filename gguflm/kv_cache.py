"""The KV cache: per-layer K and V rows stored in cells, and the cell bookkeeping.

A cell holds one token's K and V for every layer of its cache, its position and the set of
sequences it belongs to (a bit mask, so one prompt can be shared by several sequences). As in
llama.cpp's ``llama_kv_cache``: a ubatch takes free cells found from a moving head, which stays
past the last cell taken; freeing cells (``seq_rm``, ``seq_keep``, a ``seq_add`` below position 0)
moves it back to the first freed cell, so that the next prompt lies where llama.cpp's would (a
cell's index decides the lane of attention's float sums it joins: the same prompt in other cells
rounds differently). Position shifts (``seq_add``/``seq_div``) are recorded per cell and applied
to K (re-rotated with RoPE) before the next decode. Models with sliding-window layers get a
second, window-sized cache for those layers whose cells are reused once they slide out of every
window (``Memory`` dispatches to both).

With ``n_stream > 1`` (llama.cpp's non-unified cache, ``kv_unified = false``) the cells are cut
into one equal region per sequence and a token takes cells only in its sequence's region, from
that region's own head, and the sequence operations look at that region only, as llama.cpp's KV
streams (a copy to another sequence copies the region). A sequence's cells then sit where they
would if it were alone, so its attention sums run in the same order whatever the other sequences
do (a server's parallel slots give each request the tokens it would get alone).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gguflm._ext import kv_cells, ops
from gguflm.errors import StateError
from gguflm.kv_store import RowStore, rotation


@dataclass
class Slot:
    """The cells one ubatch will occupy, and what they held before (to roll back)."""

    cells: np.ndarray          # int64 [n_tokens]
    old_pos: np.ndarray        # int32 [n_tokens]
    old_seq: np.ndarray        # uint64 [n_tokens]


class KVCache:
    """One cache: ``size`` cells for the layers ``layers`` (model layer indices).

    ``k[il]``/``v[il]`` are [size, n_embd_{k,v}_gqa(il)] arrays of the cache type; ``n_swa > 0``
    makes cells reusable once their position is outside the window of their sequence (with
    ``chunked``, the chunk of n_swa positions of its next token); the head
    sizes decide whether a quantized cache stores rotated rows (:func:`gguflm.kv_store.rotation`).
    ``n_stream`` regions of ``size // n_stream`` cells: sequence ``s`` places its tokens in region
    ``s`` (``n_stream`` is 1 or ``n_seq_max``).
    """

    def __init__(self, size: int, layers: Sequence[int], n_embd_k: Callable[[int], int],
                 n_embd_v: Callable[[int], int], type_k: str, type_v: str, n_seq_max: int,
                 n_swa: int = 0, n_stream: int = 1, head_dim_k: int = 0, head_dim_v: int = 0,
                 chunked: bool = False):
        if n_stream not in (1, n_seq_max) or size % n_stream:
            raise ValueError(f"n_stream must be 1 or n_seq_max ({n_seq_max}) and divide the "
                             f"{size} cells, got {n_stream}")
        self.size = size
        self.layers = list(layers)
        self.n_seq_max = n_seq_max
        self.n_swa = n_swa
        self.chunked = chunked
        self.n_stream = n_stream
        self.stream_size = size // n_stream
        self.pos = np.full(size, -1, np.int32)
        self.seq = np.zeros(size, np.uint64)
        self.shift = np.zeros(size, np.int32)
        self.heads = np.zeros(n_stream, np.int64)   # per region, relative to its first cell
        rot_k, rot_v = rotation("k", type_k, head_dim_k), rotation("v", type_v, head_dim_v)
        self.k = {il: RowStore(type_k, size, n_embd_k(il), rot_k) for il in self.layers}
        self.v = {il: RowStore(type_v, size, n_embd_v(il), rot_v) for il in self.layers}

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
        return kv_cells.used_max_p1(self.pos)

    @property
    def head(self) -> int:
        """Where the next search for free cells starts (the first region's head)."""
        return int(self.heads[0])

    @head.setter
    def head(self, value: int) -> None:
        self.heads[0] = value

    # -- sequences

    def _has(self, seq_id: int) -> np.ndarray:
        return (self.seq & np.uint64(1 << seq_id)) != 0

    def _in_range(self, p0: int, p1: int) -> np.ndarray:
        p0 = 0 if p0 < 0 else p0
        p1 = np.iinfo(np.int32).max if p1 < 0 else p1
        return (self.pos >= p0) & (self.pos < p1)

    def seq_pos_min(self, seq_id: int) -> int:
        sel = self._has(seq_id)
        return int(self.pos[sel].min()) if sel.any() else -1

    def seq_pos_max(self, seq_id: int) -> int:
        if self.n_seq_max == 1:  # every occupied cell is sequence 0's, the free ones hold -1
            return int(self.pos.max())
        pos = self.pos[self._has(seq_id)]
        return int(pos.max()) if len(pos) else -1

    def _clear_cells(self, sel: np.ndarray) -> None:
        self.pos[sel] = -1
        self.seq[sel] = 0
        self.shift[sel] = 0

    def _free(self, sel: np.ndarray) -> None:
        """Empty the cells ``sel``; a region's head moves back to the first cell freed in it (never
        forward), so the next ubatch takes the freed cells from there, as llama.cpp's cache does."""
        self._clear_cells(sel)
        freed = np.flatnonzero(sel)
        if len(freed):
            streams, first = np.unique(freed // self.stream_size, return_index=True)
            self.heads[streams] = np.minimum(self.heads[streams], freed[first] - streams * self.stream_size)

    def _stream_of(self, seq_id: int) -> int:
        return seq_id if self.n_stream > 1 else 0

    def _region(self, stream: int) -> slice:
        return slice(stream * self.stream_size, (stream + 1) * self.stream_size)

    def _in_stream_of(self, seq_id: int) -> np.ndarray:
        """The cells of ``seq_id``'s region: llama.cpp's sequence operations look at no other."""
        sel = np.zeros(self.size, bool)
        sel[self._region(self._stream_of(seq_id))] = True
        return sel

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> None:
        sel = self._in_range(p0, p1)
        if seq_id < 0:
            self._free(sel & (self.pos >= 0))
            return
        sel &= self._has(seq_id) & self._in_stream_of(seq_id)
        self.seq[sel] &= ~np.uint64(1 << seq_id)
        self._free(sel & (self.seq == 0))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """``dst`` also holds ``src``'s positions [p0, p1). In one region the cells gain a bit; across
        regions (llama.cpp copies whole streams only) ``dst``'s region becomes a copy of ``src``'s
        region (rows, positions, pending shifts and head) holding ``src``'s cells for ``dst``."""
        s0, s1 = self._stream_of(src), self._stream_of(dst)
        if s0 == s1:
            sel = self._in_range(p0, p1) & self._has(src)
            self.seq[sel] |= np.uint64(1 << dst)
            return
        if (0 < p0 < self.stream_size - 1) or (0 < p1 < self.stream_size - 1):
            raise ValueError(f"copying sequence {src} to {dst} crosses cache regions, which copies "
                             f"whole sequences only (p0 and p1 < 0), got [{p0}, {p1})")
        r0, r1 = self._region(s0), self._region(s1)
        for store in (*self.k.values(), *self.v.values()):
            store.data[r1] = store.data[r0]
        held = self._has(src)[r0]
        self.pos[r1] = np.where(held, self.pos[r0], -1)
        self.shift[r1] = np.where(held, self.shift[r0], 0)
        self.seq[r1] = np.where(held, np.uint64(1 << dst), np.uint64(0))
        self.heads[s1] = self.heads[s0]

    def seq_keep(self, seq_id: int) -> None:
        region = self._in_stream_of(seq_id)
        keep = self._has(seq_id) & region
        self.seq[keep] = np.uint64(1 << seq_id)
        self._free(~keep & region & (self.pos >= 0))

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        if delta == 0 or max(p0, 0) == (p1 if p1 >= 0 else np.iinfo(np.int32).max):
            return
        sel = self._in_range(p0, p1) & self._has(seq_id) & self._in_stream_of(seq_id)
        self.pos[sel] += delta
        self.shift[sel] += delta
        # llama.cpp restarts the search in the sequence's region at its first freed cell, else at 0
        stream = self._stream_of(seq_id)
        self.heads[stream] = self.stream_size
        self._free(sel & (self.pos < 0))
        if self.heads[stream] == self.stream_size:
            self.heads[stream] = 0

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        if d == 1 or max(p0, 0) == (p1 if p1 >= 0 else np.iinfo(np.int32).max):
            return
        sel = self._in_range(p0, p1) & self._has(seq_id) & self._in_stream_of(seq_id)
        new = self.pos[sel] // d
        # llama.cpp's pos_div records old - new, the opposite sign of seq_add's shift, and its
        # K-shift rotates K by that: so does this one
        self.shift[sel] += self.pos[sel] - new
        self.pos[sel] = new

    def clear(self) -> None:
        self._clear_cells(np.ones(self.size, bool))
        self.heads[:] = 0
        for store in (*self.k.values(), *self.v.values()):
            store.clear()

    # -- placing ubatches

    def find_slot(self, n_tokens: int, seq_first: np.ndarray | None = None,
                  seq_mask: np.ndarray | None = None) -> np.ndarray | None:
        """Cells for ``n_tokens`` new tokens, or None: the first reusable cells from the head,
        wrapping (from cell 0 when the head is past the used cells + 2 n_tokens). Reusable: empty,
        or (window caches) slid out of their sequence's window (``kv_cells.find_cells``).

        With regions, ``seq_first`` (each token's first sequence) picks the region of each token.
        ``seq_mask`` (all its sequences) is what a recurrent memory's find_slot reads; unused here.
        """
        if self.n_stream == 1 or seq_first is None:
            return self._find_in_stream(0, n_tokens)
        cells = np.empty(n_tokens, np.int64)
        for stream in np.unique(seq_first):
            tokens = np.flatnonzero(seq_first == stream)
            found = self._find_in_stream(int(stream), len(tokens))
            if found is None:
                return None
            cells[tokens] = found
        return cells

    def _find_in_stream(self, stream: int, n_tokens: int) -> np.ndarray | None:
        cells = np.empty(n_tokens, np.int64)
        found = kv_cells.find_cells(self.pos, self.seq, stream * self.stream_size, self.stream_size,
                                    int(self.heads[stream]), self.n_swa, cells, self.chunked)
        return cells if found else None

    def apply(self, cells: np.ndarray, pos: np.ndarray, seq_mask: np.ndarray) -> Slot:
        """Occupy ``cells`` with tokens at ``pos`` in sequences ``seq_mask``; returns the undo."""
        slot = Slot(cells, self.pos[cells], self.seq[cells])
        overwritten = slot.old_pos >= 0
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
        if len(cells) and self.n_stream == 1:
            self.heads[0] = int(cells[-1]) + 1  # the head moves past the last cell this ubatch took
        elif len(cells):
            # each region's head moves past the last cell this ubatch took there
            last = cells[::-1]
            streams, at = np.unique(last // self.stream_size, return_index=True)
            self.heads[streams] = last[at] + 1 - streams * self.stream_size
        return slot

    # -- position shifts

    def apply_shifts(self, rope: Callable[[np.ndarray, np.ndarray, int], None], n_threads: int) -> None:
        """Re-rotate the K rows of the cells whose positions ``seq_add``/``seq_div`` moved (llama.cpp's
        K-shift): ``rope(rows, delta, il)`` rotates layer ``il``'s float32 rows in place by ``delta``
        (one position difference per row). A rotated cache's rows are turned back for RoPE and
        forward again after (the Walsh-Hadamard rotation is its own inverse)."""
        cells = np.flatnonzero(self.shift != 0)
        if not len(cells):
            return
        delta = np.ascontiguousarray(self.shift[cells], dtype=np.int32)
        for il in self.layers:
            store = self.k[il]
            rows = store.rows_f32(cells)                        # [n_cells, n_embd_k_gqa]
            if store.rotation:
                ops.hadamard(rows, store.rotation, n_threads)
            rope(rows, delta, il)
            if store.rotation:
                ops.hadamard(rows, store.rotation, n_threads)
            store.write(cells, rows)
        self.shift[cells] = 0

    def undo(self, slot: Slot) -> None:
        self.pos[slot.cells] = slot.old_pos
        self.seq[slot.cells] = slot.old_seq

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.pos.copy(), self.seq.copy(), self.shift.copy(), self.heads.copy()

    def restore(self, snap: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.pos[:], self.seq[:], self.shift[:], self.heads[:] = snap

    # -- state

    def state_arrays(self, prefix: str, seq_id: int | None = None) -> dict[str, np.ndarray]:
        """The occupied cells (only ``seq_id``'s, in its region, when given) in cell order: their
        positions, sequences, region, K and V rows; pending shifts must have been applied."""
        held = self.pos >= 0
        if seq_id is not None:
            held &= self._has(seq_id) & self._in_stream_of(seq_id)
        used = np.flatnonzero(held)
        arrays = {f"{prefix}pos": self.pos[used], f"{prefix}seq": self.seq[used],
                  f"{prefix}stream": (used // self.stream_size).astype(np.int64),
                  f"{prefix}n_stream": np.array([self.n_stream])}
        for il in self.layers:
            arrays[f"{prefix}k{il}"] = self.k[il].rows(used)
            arrays[f"{prefix}v{il}"] = self.v[il].rows(used)
        return arrays

    def saved_cells(self, prefix: str, arrays: dict[str, np.ndarray]) -> SavedCells:
        """The cells of a saved state, checked against this cache without changing it."""
        try:
            pos = np.asarray(arrays[f"{prefix}pos"])
            seq = np.asarray(arrays[f"{prefix}seq"])
            stream = np.asarray(arrays[f"{prefix}stream"])
            n_stream = int(np.asarray(arrays[f"{prefix}n_stream"]).reshape(-1)[0])
            rows = {il: (arrays[f"{prefix}k{il}"], arrays[f"{prefix}v{il}"]) for il in self.layers}
        except (KeyError, IndexError, ValueError) as exc:
            raise StateError(f"saved state lacks {exc}") from None
        n = len(pos)
        if n_stream != self.n_stream:
            raise StateError(f"saved state has {n_stream} cache regions, this cache {self.n_stream}")
        if pos.shape != (n,) or seq.shape != (n,) or stream.shape != (n,) or pos.dtype != np.int32 or \
                seq.dtype != np.uint64 or not np.issubdtype(stream.dtype, np.integer):
            raise StateError("saved state's cell lists are malformed")
        if n and (pos.min() < 0 or stream.min() < 0 or stream.max() >= self.n_stream or
                  (seq == 0).any() or (seq >> np.uint64(self.n_seq_max)).any()):
            raise StateError(f"saved state's cells lie outside this cache ({self.n_stream} regions, "
                             f"{self.n_seq_max} sequences)")
        if n and np.bincount(stream, minlength=self.n_stream).max() > self.stream_size:
            raise StateError(f"saved state holds more cells than this cache's {self.stream_size} per region")
        for il, (k, v) in rows.items():
            self.k[il].check_rows(k, n)
            self.v[il].check_rows(v, n)
        return SavedCells(pos, seq, stream.astype(np.int64), rows)

    def restore_cells(self, saved: SavedCells) -> None:
        """The whole cache becomes ``saved``, as llama.cpp restores a state: each region's cells
        from its first one on, in their saved order, and every head at its region's start."""
        self.clear()
        cells = np.empty(len(saved.pos), np.int64)
        for stream in range(self.n_stream):
            mine = np.flatnonzero(saved.stream == stream)
            cells[mine] = stream * self.stream_size + np.arange(len(mine))
        self._write_cells(cells, saved)

    def restore_sequence(self, saved: SavedCells, seq_id: int) -> bool:
        """``seq_id`` becomes the one sequence of ``saved``, in cells found as for a ubatch at its
        positions (after ``seq_id``'s old cells are freed), as llama.cpp restores a sequence's
        state. False, nothing changed, when there is no room."""
        snap = self.snapshot()
        self.seq_rm(seq_id, -1, -1)
        cells = self.find_slot(len(saved.pos), np.full(len(saved.pos), seq_id, np.int32))
        if cells is None:
            self.restore(snap)
            return False
        self.apply(cells, saved.pos, np.full(len(cells), 1 << seq_id, np.uint64))
        self._write_cells(cells, SavedCells(saved.pos, np.full(len(cells), 1 << seq_id, np.uint64),
                                            saved.stream, saved.rows))
        return True

    def _write_cells(self, cells: np.ndarray, saved: SavedCells) -> None:
        self.pos[cells] = saved.pos
        self.seq[cells] = saved.seq
        self.shift[cells] = 0
        for il, (k, v) in saved.rows.items():
            self.k[il].set_rows(cells, k)
            self.v[il].set_rows(cells, v)


@dataclass
class SavedCells:
    """A cache's cells read from a saved state (:meth:`KVCache.saved_cells`)."""

    pos: np.ndarray                                  # int32 [n]
    seq: np.ndarray                                  # uint64 [n] sequence bits
    stream: np.ndarray                               # int64 [n] region each cell was in
    rows: dict[int, tuple[np.ndarray, np.ndarray]]   # layer -> K, V rows [n, ...]


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


class SequenceIds:
    """The sequence ids a context's memory takes: 0 .. n_seq_max - 1, and (``allow_all``) a
    negative id for every sequence; others raise ValueError. Shared by :class:`Memory` and
    :class:`gguflm.memory_recurrent.RecurrentMemory`."""

    n_seq_max: int

    def _check_seq(self, seq_id: int, allow_all: bool = False) -> None:
        if not (allow_all and seq_id < 0) and not 0 <= seq_id < self.n_seq_max:
            raise ValueError(f"sequence id {seq_id} out of range [0, {self.n_seq_max})")


class Memory(SequenceIds):
    """``ctx.memory``: the sequence operations of llama.cpp's memory API over the context's caches.

    Positions and sequence ids follow llama.cpp: ``p0 < 0`` means from the start, ``p1 < 0`` to
    the end, ``seq_id < 0`` (in ``seq_rm``) every sequence.
    """

    def __init__(self, caches: Sequence[KVCache], n_seq_max: int):
        self.caches = list(caches)
        self.n_seq_max = n_seq_max

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

    def apply_shifts(self, rope: Callable[[np.ndarray, np.ndarray, int], None], n_threads: int) -> None:
        """Apply the pending position shifts to every cache's K rows (:meth:`KVCache.apply_shifts`)."""
        for c in self.caches:
            c.apply_shifts(rope, n_threads)

    def clear(self) -> None:
        """Empty every cache (and zero its data)."""
        for c in self.caches:
            c.clear()

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)
