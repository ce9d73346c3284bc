"""Recurrent memory: one conv state and one SSM state per sequence (llama.cpp's llama_memory_recurrent).

A recurrent model keeps no token rows: each sequence's past is folded into two fixed-size states
per layer, the last ``d_conv - 1`` inputs of its convolution (``r``, ``n_embd_r`` floats) and its
SSM state (``s``, ``n_embd_s`` floats). They live in cells, one per sequence at most
(``size = max(1, n_seq_max)``), with llama.cpp's bookkeeping: a cell's position is the last one
it has seen, its sequences a set (``seq_cp`` shares a cell, a later decode of either sequence
gives it a copy), and cells ``0 .. size - 1`` double as the sequences' tails (``tail[s]``: the
cell holding sequence ``s``). A ubatch's sequences take the cells ``head .. head + n_seqs - 1`` in
ubatch order (``find_slot`` swaps cells to get there); the states then move to those cells as
llama.cpp's graph moves them (``s_copy``: each cell reads the row its ``src0`` names, new cells
a zeroed one), which the forward pass does first (:meth:`RecurrentCache.moves`,
``Graph.recurrent_moves``).

A state cannot be rolled back: ``seq_rm`` removes a whole sequence, or a range that holds its
last position from 0 on; a range that would leave a shorter past returns False (llama.cpp without
``n_rs_seq`` snapshots), and nothing changes; so does ``seq_id < 0`` (llama.cpp checks the id as
unsigned before anything else).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gguflm.errors import StateError
from gguflm.kv_cache import SequenceIds

_POS_MAX = np.iinfo(np.int32).max


@dataclass
class _Cells:
    """llama.cpp's mem_cell fields, one list entry per cell."""

    pos: list[int]
    src: list[int]           # the row holding the cell's state (-1: none, a zero state)
    src0: list[int]          # the row the next forward pass copies into this cell
    tail: list[int]          # as a sequence id: the cell holding that sequence, or -1
    seq: list[set[int]]
    head: int = 0            # the first cell of the last ubatch placed
    n: int = 0               # and how many cells from there its states moved in
    used: int = 0
    rs_z: int = -1           # a row no cell reads: zeroed for the new states

    @classmethod
    def empty(cls, size: int) -> _Cells:
        return cls([-1] * size, [-1] * size, [-1] * size, [-1] * size, [set() for _ in range(size)])

    def free(self, i: int) -> None:
        self.pos[i] = -1
        self.src[i] = -1


def _sets_of(seq_mask: np.ndarray) -> tuple[list[list[int]], int]:
    """The sequence sets of an equal-split ubatch in order (each a sorted list of its
    sequences), and how many tokens each has."""
    n = len(seq_mask)
    first = int(seq_mask[0])
    n_seq_tokens = next((i for i in range(n) if int(seq_mask[i]) != first), n)
    return [_bits(int(m)) for m in seq_mask[::n_seq_tokens]], n_seq_tokens


def _bits(mask: int) -> list[int]:
    return [s for s in range(mask.bit_length()) if mask >> s & 1]


class RecurrentCache:
    """The cells and their states: ``r[il]``/``s[il]`` are [size, n_embd_r]/[size, n_embd_s]
    float32 views of one block per kind (``r_all``: [n_layer, size, n_embd_r]) for the layers
    ``layers`` (the others have rows too, unused: hybrid models' attention layers).

    It takes the place of a KV cache in the context's list: ``find_slot`` gives each token of a
    ubatch the cell of its sequence, ``apply`` places the ubatch and stages the state moves.
    """

    n_stream = 1

    def __init__(self, size: int, layers: list[int], n_layer: int, n_embd_r: int, n_embd_s: int, n_seq_max: int):
        self.size = size
        self.layers = list(layers)
        self.n_seq_max = n_seq_max
        self.n_embd_r, self.n_embd_s = n_embd_r, n_embd_s
        self.r_all = np.zeros((n_layer, size, n_embd_r), np.float32)
        self.s_all = np.zeros((n_layer, size, n_embd_s), np.float32)
        self.r = {il: self.r_all[il] for il in self.layers}
        self.s = {il: self.s_all[il] for il in self.layers}
        # the moves the next forward pass makes first: [count, (dst, src) * count], src -1: zero
        self.moves = np.zeros(1 + 2 * size, np.int32)
        self.cells = _Cells.empty(size)

    def commit(self) -> None:
        """Write the states once (resident from the start, as llama.cpp clears its buffers)."""
        self.r_all.fill(0.0)
        self.s_all.fill(0.0)

    # -- sizes

    @property
    def nbytes(self) -> int:
        return self.r_all[self.layers].nbytes + self.s_all[self.layers].nbytes if self.layers else 0

    @property
    def n_used(self) -> int:
        return sum(1 for s in self.cells.seq if s)

    @property
    def used_max_p1(self) -> int:
        """The cells a forward pass may touch (the context hands every cache's to its plan)."""
        return self.size

    # -- sequences

    def seq_pos_min(self, seq_id: int) -> int:
        found = [p for p, s in zip(self.cells.pos, self.cells.seq) if seq_id in s]
        return min(found) if found else -1

    def seq_pos_max(self, seq_id: int) -> int:
        return max((p for p, s in zip(self.cells.pos, self.cells.seq) if seq_id in s), default=-1)

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        c, size = self.cells, self.size
        p0 = max(p0, 0)
        p1 = _POS_MAX if p1 < 0 else p1
        if not 0 <= seq_id < min(size, self.n_seq_max):   # llama.cpp refuses every sequence at once too
            return False
        tail = c.tail[seq_id]
        if tail >= 0:
            pos = c.pos[tail]
            if 0 < p0 <= pos < p1:
                return False   # the state before p0 is gone
            if p0 <= pos < p1:
                c.tail[seq_id] = -1
        new_head = size
        for i in range(size):
            if not p0 <= c.pos[i] < p1 or seq_id not in c.seq[i]:
                continue
            c.seq[i].discard(seq_id)
            if not c.seq[i]:
                if c.pos[i] >= 0:
                    c.used -= 1
                c.free(i)
                new_head = min(new_head, i)
        if new_head < c.head:
            c.head = new_head
        return True

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        c = self.cells
        if src == dst or not (0 <= src < self.size and 0 <= dst < self.size):
            return
        if c.tail[dst] >= 0:
            cell = c.tail[dst]
            c.seq[cell].discard(dst)
            c.tail[dst] = -1
            if not c.seq[cell]:
                c.free(cell)
                c.used -= 1
        if c.tail[src] >= 0:
            c.seq[c.tail[src]].add(dst)
            c.tail[dst] = c.tail[src]

    def seq_keep(self, seq_id: int) -> None:
        c = self.cells
        new_head = self.size
        for i in range(self.size):
            if i != seq_id:
                c.tail[i] = -1
            if seq_id not in c.seq[i]:
                if c.pos[i] >= 0:
                    c.used -= 1
                c.free(i)
                c.seq[i].clear()
                new_head = min(new_head, i)
            else:
                c.seq[i] = {seq_id}
        if new_head < c.head:
            c.head = new_head

    def _tail_in(self, seq_id: int, p0: int, p1: int) -> int:
        """The tail cell of ``seq_id`` if its position is in [p0, p1), else -1."""
        p0 = max(p0, 0)
        p1 = _POS_MAX if p1 < 0 else p1
        if p0 == p1 or not 0 <= seq_id < self.size:
            return -1
        tail = self.cells.tail[seq_id]
        if tail >= 0 and seq_id in self.cells.seq[tail] and p0 <= self.cells.pos[tail] < p1:
            return tail
        return -1

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        # only the position moves: a state holds no positions
        tail = self._tail_in(seq_id, p0, p1) if delta else -1
        if tail >= 0:
            self.cells.pos[tail] += delta

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        tail = self._tail_in(seq_id, p0, p1) if d != 1 else -1
        if tail >= 0:
            pos = self.cells.pos[tail]
            self.cells.pos[tail] = int(np.trunc(pos / d))   # C's division

    def clear(self) -> None:
        self.cells = _Cells.empty(self.size)
        self.moves[0] = 0
        self.commit()

    # -- placing ubatches

    def find_slot(self, n_tokens: int, seq_first: np.ndarray | None = None,
                  seq_mask: np.ndarray | None = None) -> np.ndarray | None:
        """The cell of each token of an equal-split ubatch (its sequence sets in order, as many
        tokens each; ``seq_mask``, else ``seq_first``, says them): what placing it would give,
        nothing changed."""
        if seq_mask is None:
            seq_mask = (np.uint64(1) << (np.zeros(n_tokens, np.uint64) if seq_first is None
                                         else seq_first.astype(np.uint64)))
        sets, n_seq_tokens = _sets_of(seq_mask)
        cells = copy.deepcopy(self.cells)
        if not self._place(cells, sets, None):
            return None
        return np.repeat(np.arange(cells.head, cells.head + len(sets), dtype=np.int64), n_seq_tokens)

    def apply(self, cells: np.ndarray, pos: np.ndarray, seq_mask: np.ndarray) -> None:
        """Place the ubatch (llama.cpp's find_slot) and stage the state moves of its forward pass."""
        n = len(pos)
        first = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]])
        sets = [_bits(int(seq_mask[i])) for i in first]
        last = [int(pos[i - 1]) for i in np.r_[first[1:], n]]
        if not self._place(self.cells, sets, last):
            raise RuntimeError("recurrent memory: a placed ubatch no longer fits")
        self._stage_moves()

    def _place(self, c: _Cells, sets: list[list[int]], last_pos: list[int] | None) -> bool:
        """llama_memory_recurrent::find_slot on ``c`` for a ubatch of these sequence sets (each
        in one cell of its own, found by its first sequence: the lowest id, where llama.cpp takes
        the first the batch lists, which decides only the cell) whose last positions are
        ``last_pos`` (None: a dry run)."""
        size, n_seqs = self.size, len(sets)
        if c.head > c.used + 2 * n_seqs:
            c.head = 0
        if any(not 0 <= s < size for seq_set in sets for s in seq_set):
            return False
        for seq_set in sets:   # the other sequences of a coupled set leave their cells
            for s in seq_set[1:]:
                tail = c.tail[s]
                if tail >= 0:
                    c.seq[tail].discard(s)
                    c.tail[s] = -1
                    if not c.seq[tail]:
                        c.free(tail)
                        c.used -= 1
        seqs = [seq_set[0] for seq_set in sets]
        nxt = c.head
        for _ in range(size):
            if nxt >= size:
                nxt -= size
            if not c.seq[nxt]:
                break
            nxt += 1
        lo, hi = size - 1, 0
        for k, s in enumerate(seqs):
            tail = c.tail[s]
            if tail < 0 or len(c.seq[tail]) != 1:   # no cell of its own: take the next empty one
                if c.seq[nxt]:
                    return False
                if tail >= 0:   # a shared cell: this sequence gets a copy
                    c.pos[nxt], c.src[nxt] = c.pos[tail], c.src[tail]
                    c.seq[tail].discard(s)
                    c.seq[nxt].add(s)
                c.tail[s] = nxt
                if k + 1 < n_seqs:
                    for _ in range(size):
                        nxt += 1
                        if nxt >= size:
                            nxt -= size
                        if not c.seq[nxt]:
                            break
            lo, hi = min(lo, c.tail[s]), max(hi, c.tail[s])
        # the ubatch's sequences into cells lo, lo + 1, ... in order
        for k, s in enumerate(seqs):
            dst, src = lo + k, c.tail[s]
            if dst != src:
                c.pos[dst], c.pos[src] = c.pos[src], c.pos[dst]
                c.src[dst], c.src[src] = c.src[src], c.src[dst]
                c.seq[dst], c.seq[src] = c.seq[src], c.seq[dst]
                c.tail = [dst if t == src else src if t == dst else t for t in c.tail]
        for k, seq_set in enumerate(sets):
            cell = lo + k
            if last_pos is not None:
                c.pos[cell] = last_pos[k]
            c.seq[cell] = set(seq_set)
            for s in seq_set:
                c.tail[s] = cell
        # a row no cell reads, zeroed for the cells without a state
        refs = [0] * size
        for src in c.src:
            if src >= 0:
                refs[src] += 1
        c.rs_z = next((i for i in range(lo, hi + 1) if refs[i] == 0), -1)
        for i in range(lo, hi + 1):
            if c.src[i] < 0:
                if c.rs_z < 0:
                    return False
                c.src0[i] = c.rs_z
            else:
                c.src0[i] = c.src[i]
            c.src[i] = i
        c.head = lo
        c.n = hi - lo + 1
        c.used = sum(1 for s in c.seq if s)
        return c.n >= n_seqs

    def _stage_moves(self) -> None:
        """The rows of cells head .. head + n get the states their src0 names (rs_z: zero)."""
        c = self.cells
        moves = [(i, -1 if c.src0[i] == c.rs_z else c.src0[i])
                 for i in range(c.head, c.head + c.n) if c.src0[i] != i or c.src0[i] == c.rs_z]
        self.moves[0] = len(moves)
        if moves:
            self.moves[1:1 + 2 * len(moves)] = np.array(moves, np.int32).reshape(-1)

    def snapshot(self) -> tuple[_Cells, np.ndarray]:
        return copy.deepcopy(self.cells), self.moves.copy()

    def restore(self, snap: tuple[_Cells, np.ndarray]) -> None:
        self.cells = copy.deepcopy(snap[0])
        self.moves[:] = snap[1]

    def run_moves(self) -> None:
        """Make the staged moves now (what the next forward pass would do first)."""
        n = int(self.moves[0])
        if n:
            pairs = self.moves[1:1 + 2 * n].reshape(n, 2)
            for store in (self.r_all, self.s_all):
                rows = np.where(pairs[:, 1:2] < 0, 0.0, store[:, np.maximum(pairs[:, 1], 0)].transpose(1, 0, 2)
                                .reshape(n, -1)).reshape(n, store.shape[0], -1).transpose(1, 0, 2)
                store[:, pairs[:, 0]] = rows
            self.moves[0] = 0

    # -- state

    def state_arrays(self, prefix: str, seq_id: int | None = None) -> dict[str, np.ndarray]:
        """The cells in use (or ``seq_id``'s) in cell order: positions, sequences as bits, the
        states of every layer."""
        self.run_moves()
        used = [i for i, s in enumerate(self.cells.seq) if (s if seq_id is None else seq_id in s)]
        seq = [sum(1 << s for s in self.cells.seq[i]) for i in used]
        arrays = {f"{prefix}pos": np.array([self.cells.pos[i] for i in used], np.int32),
                  f"{prefix}seq": np.array(seq, np.uint64)}
        for il in self.layers:
            arrays[f"{prefix}r{il}"] = self.r[il][used]
            arrays[f"{prefix}s{il}"] = self.s[il][used]
        return arrays

    def saved_cells(self, prefix: str, arrays: dict[str, np.ndarray]) -> SavedStates:
        """The cells of a saved state, checked against this memory without changing it."""
        try:
            pos = np.asarray(arrays[f"{prefix}pos"])
            seq = np.asarray(arrays[f"{prefix}seq"])
            rows = {il: (np.asarray(arrays[f"{prefix}r{il}"]), np.asarray(arrays[f"{prefix}s{il}"]))
                    for il in self.layers}
        except KeyError as exc:
            raise StateError(f"saved state lacks {exc}") from None
        n = len(pos)
        if pos.shape != (n,) or seq.shape != (n,) or pos.dtype != np.int32 or seq.dtype != np.uint64:
            raise StateError("saved state's cell lists are malformed")
        if n > self.size:
            raise StateError(f"saved state holds {n} recurrent states, this memory {self.size} cells")
        if n and (pos.min() < 0 or (seq == 0).any() or (seq >> np.uint64(self.n_seq_max)).any()):
            raise StateError(f"saved state's cells lie outside this memory ({self.n_seq_max} sequences)")
        owners = [s for bits in seq.tolist() for s in range(self.n_seq_max) if bits >> s & 1]
        if len(owners) != len(set(owners)):
            raise StateError("saved state gives a sequence two recurrent states")
        for il, (r, s) in rows.items():
            if r.shape != (n, self.n_embd_r) or s.shape != (n, self.n_embd_s) or \
                    r.dtype != np.float32 or s.dtype != np.float32:
                raise StateError(f"saved recurrent states of layer {il} have the wrong shape or type")
        return SavedStates(pos, seq, rows)

    def restore_cells(self, saved: SavedStates) -> None:
        """The whole memory becomes ``saved``: its cells from cell 0 on, as llama.cpp restores."""
        self.clear()
        c = self.cells
        for i, (p, bits) in enumerate(zip(saved.pos.tolist(), saved.seq.tolist())):
            c.pos[i], c.src[i] = p, i
            c.seq[i] = {s for s in range(self.n_seq_max) if bits >> s & 1}
            for s in c.seq[i]:
                c.tail[s] = i
        c.used = len(saved.pos)
        self._write(list(range(len(saved.pos))), saved)

    def restore_sequence(self, saved: SavedStates, seq_id: int) -> bool:
        """``seq_id`` becomes the one sequence of ``saved`` (its old state dropped first), placed
        as a ubatch of it would be. False, nothing changed, when there is no room."""
        if len(saved.pos) > 1:
            return False
        snap = self.snapshot()
        self.seq_rm(seq_id, -1, -1)
        if not len(saved.pos):
            return True
        if not self._place(self.cells, [[seq_id]], [int(saved.pos[0])]):
            self.restore(snap)
            return False
        cell = self.cells.head
        self.cells.src[cell] = cell
        self.moves[0] = 0   # the saved state replaces what the placing staged
        self._write([cell], saved)
        return True

    def _write(self, cells: list[int], saved: SavedStates) -> None:
        for il, (r, s) in saved.rows.items():
            self.r[il][cells] = r
            self.s[il][cells] = s


@dataclass
class SavedStates:
    """A recurrent memory's cells read from a saved state (:meth:`RecurrentCache.saved_cells`)."""

    pos: np.ndarray                                  # int32 [n]
    seq: np.ndarray                                  # uint64 [n] sequence bits
    rows: dict[int, tuple[np.ndarray, np.ndarray]]   # layer -> conv, SSM states [n, ...]


class RecurrentMemory(SequenceIds):
    """``ctx.memory`` of a recurrent model: llama.cpp's memory API over its recurrent cache.

    As llama.cpp's: ``p0 < 0`` means from the start, ``p1 < 0`` to the end; ``seq_rm`` with
    ``seq_id < 0`` returns False (clear empties everything). Other sequence ids out of range
    raise ValueError, as the KV cache's :class:`gguflm.kv_cache.Memory` does.
    """

    def __init__(self, cache: RecurrentCache, n_seq_max: int):
        self.cache = cache
        self.caches = [cache]
        self.n_seq_max = n_seq_max

    def seq_pos_min(self, seq_id: int) -> int:
        """The sequence's position (a state holds only its last one), -1 if it has none."""
        self._check_seq(seq_id)
        return self.cache.seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return self.cache.seq_pos_max(seq_id)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Drop ``seq_id``'s state if [p0, p1) holds its last position and starts at 0 (or holds
        none of its positions: nothing to do); False, nothing changed, for a range that would
        keep part of its past, and for ``seq_id < 0``."""
        self._check_seq(seq_id, allow_all=True)
        return self.cache.seq_rm(seq_id, p0, p1)

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        """``seq_id_dst`` gets ``seq_id_src``'s state (shared until either decodes again)."""
        self._check_seq(seq_id_src)
        self._check_seq(seq_id_dst)
        self.cache.seq_cp(seq_id_src, seq_id_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self._check_seq(seq_id)
        self.cache.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Move the sequence's position by ``delta`` if it is in [p0, p1)."""
        self._check_seq(seq_id)
        self.cache.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self._check_seq(seq_id)
        if d < 1:
            raise ValueError(f"divisor must be >= 1, got {d}")
        self.cache.seq_div(seq_id, p0, p1, d)

    def apply_shifts(self, rope: Callable[[np.ndarray, np.ndarray, int], None], n_threads: int) -> None:
        """Nothing to re-rotate: a state holds no positions."""

    def clear(self) -> None:
        self.cache.clear()

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes
