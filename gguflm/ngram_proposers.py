"""llama.cpp's n-gram proposers for speculative decoding (``--spec-type ngram-simple``,
``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``, ``ngram-cache``).

Each class drafts from the tokens so far as llama.cpp's ``common/`` code does: for the same
history, the same parameters and the same sequence of calls (``begin``, ``propose``, ``accept``)
it proposes the same tokens. Where llama.cpp keeps state between calls (the n-gram map's hash
index and statistics, ngram-mod's hash table, ngram-cache's counts), so does the class, and the
state changes at the same calls: a proposer whose calls are skipped (see
:class:`gguflm.speculative.Speculation`'s back-off) sees what llama.cpp sees when llama-server
does not draft at a step.

In llama.cpp's terms the history passed to ``propose`` is the slot's ``prompt`` (the tokens in
the context) followed by ``id_last`` (the token just sampled, not decoded yet).

Each class is a :class:`gguflm.speculative.Proposer` for ``LLM(draft_model=...)`` and has
``spawn()``, a proposer for another server slot sharing what llama.cpp shares between slots
(ngram-mod's table, ngram-cache's static and dynamic caches).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from gguflm.errors import SpeculationError

__all__ = ["NgramSimple", "NgramMap", "NgramMod", "NgramCache", "NGRAM_SPEC_TYPES", "NGRAM_FLAGS",
           "ngram_proposer", "add_ngram_arguments", "ngram_proposer_from_args", "ngram_cache_update",
           "load_ngram_cache", "save_ngram_cache"]

# the spec types of this module, llama.cpp's names
NGRAM_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def _starts(arr: np.ndarray, key: Sequence[int], lo: int, hi: int) -> np.ndarray:
    """The ascending starts j in [lo, hi] (both ends) where ``arr[j:j+len(key)] == key``."""
    n = len(key)
    lo, hi = max(lo, 0), min(hi, arr.shape[0] - n)
    if hi < lo:
        return np.empty(0, dtype=np.intp)
    cand = lo + np.flatnonzero(arr[lo:hi + 1] == key[0])
    for k in range(1, n):
        if not cand.shape[0]:
            break
        cand = cand[arr[cand + k] == key[k]]
    return cand


def _window_hashes(arr: np.ndarray, starts: np.ndarray, n: int, factor: int, bits: int) -> np.ndarray:
    """``h = h * factor + token`` over each n-token window from ``starts``, modulo 2**bits
    (bits <= 32: the low bits of a wrapping 32- or 64-bit product need only the operands' low
    bits, so uint32 arithmetic gives llama.cpp's size_t and uint32_t hashes alike)."""
    f = np.uint32(factor & 0xFFFFFFFF)
    h = np.zeros(starts.shape[0], dtype=np.uint32)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * f + arr[starts + k].astype(np.uint32)
    return h & np.uint32((1 << bits) - 1)


def _hash(tokens: Iterable[int], factor: int, bits: int) -> int:
    """:func:`_window_hashes` of one window."""
    h, mask = 0, (1 << bits) - 1
    for t in tokens:
        h = (h * factor + int(t)) & mask
    return h


class NgramSimple:
    """ngram-simple: the ``size_m`` tokens that followed the latest earlier occurrence of the last
    ``size_n`` tokens (llama.cpp's ``common_ngram_simple_draft``; stateless).

    Drafts only when the history (without the sampled token) is longer than size_n + size_m + 1,
    searches starts 1 .. len - size_n - 1 from the end (position 0 never matches) and drops a
    draft shorter than ``size_n``.

    Parameters
    ----------
    size_n, size_m
        ``--spec-ngram-simple-size-n`` / ``-size-m`` (llama.cpp's defaults 12 and 48).
    """

    def __init__(self, size_n: int = 12, size_m: int = 48) -> None:
        if size_n < 1 or size_m < 1:
            raise SpeculationError(f"ngram-simple needs size_n >= 1 and size_m >= 1, got {size_n}, {size_m}")
        self.size_n, self.size_m = int(size_n), int(size_m)

    def spawn(self) -> NgramSimple:
        return NgramSimple(self.size_n, self.size_m)

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, history: Sequence[int], n_max: int) -> list[int]:
        n, m = self.size_n, self.size_m
        cur_len = len(history) - 1   # the prompt, without the sampled token
        if cur_len <= n + m + 1 or n_max < 1:
            return []
        arr = np.asarray(history, dtype=np.int64)
        hits = _starts(arr, history[-n:], 1, cur_len - n - 1)
        if not hits.shape[0]:
            return []
        pos = int(hits[-1])
        copy = min(m, cur_len - (pos + n))
        return [int(t) for t in arr[pos + n:pos + n + copy]] if copy >= n else []

    def accept(self, n_accepted: int) -> None:
        pass

    def close(self) -> None:
        pass


class _Key:
    """One key n-gram's statistics (llama.cpp's ``common_ngram_map_key``)."""

    __slots__ = ("key_idx", "stat_idx", "key_num", "values")

    def __init__(self, key_idx: int, m: int) -> None:
        self.key_idx, self.stat_idx, self.key_num = key_idx, 0, 0
        # [value_idx, value_num, n_accepted]: where the value m-gram starts (0: unused), how often
        # it followed the key, the accepted tokens when it was last drafted
        self.values = [[0, 0, m] for _ in range(NgramMap.MAX_VALUES)]


class NgramMap:
    """ngram-map-k (``key_only``) and ngram-map-k4v: the tokens after an earlier occurrence of the
    last ``size_n`` tokens, found through a hash index of the history, with statistics per key
    n-gram (llama.cpp's ``common_ngram_map_begin`` / ``_draft`` / ``_accept``).

    The index (2**18 buckets of the LCG hash, first writer wins, collisions miss) and the
    statistics persist across requests as llama.cpp's per-slot map does; ``begin`` drops what
    lies past a shortened history. ngram-map-k drafts the size_m tokens after the match, cut to
    the tokens accepted the last time that key drafted; ngram-map-k4v counts the (up to 4)
    different m-grams that followed the key and drafts only once the key was seen ``min_hits``
    times and the most frequent m-gram at least twice as often as the others together.

    Parameters
    ----------
    size_n, size_m, min_hits
        ``--spec-ngram-map-k[4v]-size-n`` / ``-size-m`` / ``-min-hits`` (defaults 12, 48, 1).
    key_only
        True: ngram-map-k; False: ngram-map-k4v.
    """

    HASH_SIZE = 262144          # COMMON_NGRAM_HASH_MAP_SIZE
    HASH_BITS = 18
    LCG_FACTOR = 2654435761
    MAX_VALUES = 4              # COMMON_NGRAM_MAX_VALUES
    MAX_VALUE_COUNT = 16380     # COMMON_NGRAM_MAX_VALUE_COUNT

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, key_only: bool = True) -> None:
        if size_n < 1 or size_m < 1 or min_hits < 1:
            raise SpeculationError(f"ngram-map needs size_n, size_m and min_hits >= 1, "
                                   f"got {size_n}, {size_m}, {min_hits}")
        self.size_n, self.size_m, self.min_hits = int(size_n), int(size_m), int(min_hits)
        self.key_only = bool(key_only)
        self.keys: list[_Key] = []
        self._key_offset: dict[tuple[int, ...], int] = {}   # key n-gram -> first key with it
        self.key_map = np.zeros(self.HASH_SIZE, dtype=np.uint32)   # bucket -> n-gram start (0: none)
        self.key_map_last_idx = 0
        self.size_last_begin = 0
        self.idx_last_check = 0
        self._last: tuple[int, int] | None = None   # (key offset, value slot) of the last draft

    @property
    def spec_type(self) -> str:
        return "ngram-map-k" if self.key_only else "ngram-map-k4v"

    def spawn(self) -> NgramMap:
        return NgramMap(self.size_n, self.size_m, self.min_hits, self.key_only)

    def begin(self, prompt: Sequence[int]) -> None:
        size_begin, n, m = len(prompt), self.size_n, self.size_m
        cleanup = self.size_last_begin
        if cleanup > size_begin:
            cleanup = size_begin - n - m if size_begin > n + m else 0
        if size_begin < self.idx_last_check:
            # a shorter history: forget what indexes past the part kept
            self.key_map[self.key_map >= cleanup] = 0   # (bucket 0 stays "none")
            self.key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
            kept = []
            for key in self.keys:
                if key.key_idx >= cleanup:
                    continue
                if not self.key_only:
                    vals = [v for v in key.values if not (v[0] != 0 and v[0] >= cleanup)]
                    # freed slots at the end keep the last slot's n_accepted, as llama.cpp's shift does
                    last_acc = key.values[-1][2]
                    key.values = vals + [[0, 0, last_acc] for _ in range(self.MAX_VALUES - len(vals))]
                    if key.values[0][0] == 0:
                        continue
                kept.append(key)
            self.keys = kept
        self.idx_last_check = self.size_last_begin = size_begin
        # every key's n-gram now lies in the prompt (keys past a cut were dropped)
        self._key_offset = {}
        for i, key in enumerate(self.keys):
            self._key_offset.setdefault(tuple(int(t) for t in prompt[key.key_idx:key.key_idx + n]), i)

    def _index(self, arr: np.ndarray, hi: int, lo: int) -> None:
        """Index the starts hi, hi-1, ..., lo+1 in that order, each only into an empty bucket."""
        if hi <= lo:
            return
        js = np.arange(hi, lo, -1)
        buckets = _window_hashes(arr, js, self.size_n, self.LCG_FACTOR, self.HASH_BITS)
        uniq, first = np.unique(buckets, return_index=True)   # first in order: the highest start
        empty = self.key_map[uniq] == 0
        self.key_map[uniq[empty]] = js[first[empty]]

    def propose(self, history: Sequence[int], n_max: int) -> list[int]:
        self._last = None
        n, m = self.size_n, self.size_m
        cur_len = len(history) - 1
        if cur_len < 2 * n + m:
            return []
        arr = np.asarray(history, dtype=np.int64)
        key = [int(t) for t in history[-n:]]   # the last n-1 prompt tokens and the sampled one
        self.idx_last_check = cur_len
        top = cur_len - n - m - 1   # the last start with m tokens and one more after its key
        slb, kmli = self.size_last_begin, self.key_map_last_idx

        # the index first, then the prompt's unindexed starts, then the generated ones, each latest first
        match = 0
        idx = int(self.key_map[_hash(key, self.LCG_FACTOR, self.HASH_BITS)])
        if idx != 0 and idx < top and arr[idx:idx + n].tolist() == key:
            match = idx
        if match == 0 and slb > n + m + 1:
            hits = _starts(arr, key, kmli + 1, slb - n - m - 1)
            match = int(hits[-1]) if hits.shape[0] else 0
        if match == 0:
            hits = _starts(arr, key, max(slb, kmli) + 1, top)
            match = int(hits[-1]) if hits.shape[0] else 0

        if slb > n + m + 1:
            self._index(arr, slb - n - m - 1, kmli)
        self._index(arr, top, max(slb, kmli))
        self.key_map_last_idx = max(top, kmli)
        if match == 0:
            return []

        tkey = tuple(key)
        offset = self._key_offset.get(tkey)
        if offset is None:
            offset = len(self.keys)
            self.keys.append(_Key(match, m))
            self._key_offset[tkey] = offset
        cur = self.keys[offset]
        cur.key_num = min(cur.key_num + 1, self.MAX_VALUE_COUNT)

        if self.key_only:
            slot = 0
        else:
            if cur.key_num < self.min_hits:
                return []
            # count the m-grams after each occurrence of the key since the last count
            for i in _starts(arr, key, cur.stat_idx, match).tolist():
                value = arr[i + n:i + n + m].tolist()
                for v in cur.values:
                    if v[0] == 0:
                        v[0], v[1], v[2] = i + n, 0, m
                    elif arr[v[0]:v[0] + m].tolist() != value:
                        continue
                    v[1] = min(v[1] + 1, self.MAX_VALUE_COUNT)
                    break
            cur.stat_idx = match
            counts = [v[1] for v in cur.values]
            slot = counts.index(max(counts)) if max(counts) > 0 else 0
            others = sum(counts) - counts[slot]
            if others > 0 and counts[slot] < 2 * others:
                return []   # no m-gram clearly the most frequent
        n_draft = min(m, cur.values[slot][2])
        self._last = (offset, slot)
        return arr[match + n:match + n + max(n_draft, 0)].tolist()

    def accept(self, n_accepted: int) -> None:
        if self._last is not None:
            offset, slot = self._last
            self.keys[offset].values[slot][2] = int(n_accepted)

    def close(self) -> None:
        pass


class _ModTable:
    """ngram-mod's hash table, shared by the slots (llama.cpp's ``common_ngram_mod``): bucket of
    the n-gram -> the token that last followed an n-gram of that bucket."""

    SIZE_BITS = 22              # 4 * 1024 * 1024 entries
    FACTOR = 6364136223846793005
    EMPTY = -1

    def __init__(self, n: int) -> None:
        self.n = n
        self.entries = np.full(1 << self.SIZE_BITS, self.EMPTY, dtype=np.int32)
        self.used = 0

    def reset(self) -> None:
        self.entries.fill(self.EMPTY)
        self.used = 0

    def add_range(self, arr: np.ndarray, lo: int, hi: int) -> None:
        """``add`` at starts lo .. hi-1 in order: each n-gram's bucket gets the token after it."""
        if hi <= lo:
            return
        starts = np.arange(lo, hi)
        idx = _window_hashes(arr, starts, self.n, self.FACTOR, self.SIZE_BITS).astype(np.intp)
        # the last write to a bucket wins
        uniq, last_rev = np.unique(idx[::-1], return_index=True)
        last = idx.shape[0] - 1 - last_rev
        self.used += int((self.entries[uniq] == self.EMPTY).sum())
        self.entries[uniq] = arr[starts[last] + self.n]

    def get(self, h: int) -> int:
        return int(self.entries[h])


class NgramMod:
    """ngram-mod: follows a chain through a hash table of the token after every ``n_match``-gram
    (llama.cpp's ``common_speculative_impl_ngram_mod``): the last n_match tokens give the next,
    which with the n_match - 1 before it gives the one after, up to ``n_max``; a chain that ends
    before ``n_min`` drafts nothing.

    The table (4M buckets, no collision check, later writes win) is shared by the slots of a
    server (:meth:`spawn`); a request's prompt is added at ``begin`` and then the generated
    tokens in chunks of more than 32. The table is cleared when a quarter of it is used after
    a prompt, and after five drafts in a row with less than a quarter accepted.

    Parameters
    ----------
    n_match, n_min, n_max
        ``--spec-ngram-mod-n-match`` / ``-n-min`` / ``-n-max`` (defaults 24, 48, 64).
    """

    CHUNK = 32
    OCCUPANCY_RESET = 0.25
    LOW_ACCEPTANCE = 0.25
    LOW_STREAK = 5

    def __init__(self, n_match: int = 24, n_min: int = 48, n_max: int = 64, *, _table: _ModTable | None = None) -> None:
        if n_match < 1 or n_min < 0 or n_max < 0:
            raise SpeculationError(f"ngram-mod needs n_match >= 1, n_min >= 0, n_max >= 0, "
                                   f"got {n_match}, {n_min}, {n_max}")
        self.n_match, self.n_min, self.n_max = int(n_match), int(n_min), int(n_max)
        self.table = _table if _table is not None else _ModTable(self.n_match)
        self.i_last = 0          # the prompt's n-grams added up to here
        self.n_draft_last = 0
        self.n_low = 0

    def spawn(self) -> NgramMod:
        return NgramMod(self.n_match, self.n_min, self.n_max, _table=self.table)

    def begin(self, prompt: Sequence[int]) -> None:
        self.i_last = self.n_draft_last = 0
        n, size = self.n_match, len(prompt)
        if size < n:
            return
        self.table.add_range(np.asarray(prompt, dtype=np.int64), 0, size - n)
        self.i_last = size - n
        if self.table.used / self.table.entries.shape[0] > self.OCCUPANCY_RESET:
            self.table.reset()

    def propose(self, history: Sequence[int], n_max: int) -> list[int]:
        self.n_draft_last = 0
        n, cur_len = self.n_match, len(history) - 1
        if cur_len < n:
            return []
        if self.i_last + self.CHUNK < cur_len:
            self.table.add_range(np.asarray(history, dtype=np.int64), self.i_last, cur_len - n)
            self.i_last = cur_len - n
        bits = _ModTable.SIZE_BITS
        mask = (1 << bits) - 1
        window = [int(t) for t in history[-n:]]
        h = _hash(window, _ModTable.FACTOR, bits)
        lead = pow(_ModTable.FACTOR, n - 1, 1 << bits)   # the first token's weight in the hash
        out: list[int] = []
        for i in range(self.n_max):
            token = self.table.get(h)
            if token == _ModTable.EMPTY:
                if i < self.n_min:
                    return []
                break
            out.append(token)
            # roll the window on by the new token
            h = ((h - window[i] * lead) * _ModTable.FACTOR + token) & mask
            window.append(token)
        self.n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int) -> None:
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < self.LOW_ACCEPTANCE:
                self.n_low += 1
                if self.n_low >= self.LOW_STREAK:
                    self.table.reset()
                    self.n_low = self.i_last = 0
            else:
                self.n_low = 0

    def close(self) -> None:
        pass


# -- ngram-cache: llama-lookup's n-gram -> next-token counts

NGRAM_MIN, NGRAM_MAX, NGRAM_STATIC = 1, 4, 2    # LLAMA_NGRAM_MIN / _MAX / _STATIC
TOKEN_NULL = -1
# drafting stops unless the best next token was seen this often and this share of the time
# (index: n-gram size - 1); lax for the context, strict for the dynamic cache
_MIN_SAMPLES_LAX, _MIN_PERCENT_LAX = (2, 2, 1, 1), (66, 50, 50, 50)
_MIN_SAMPLES_STRICT, _MIN_PERCENT_STRICT = (4, 3, 2, 2), (75, 66, 66, 66)

NgramCounts = dict[tuple[int, ...], dict[int, int]]   # n-gram -> {next token: count}


def ngram_cache_update(cache: NgramCounts, tokens: Sequence[int], ngram_min: int = NGRAM_MIN,
                       ngram_max: int = NGRAM_MAX, n_new: int | None = None) -> None:
    """Count, for each n-gram of ``tokens`` (n in [ngram_min, ngram_max]), the token after it,
    for the last ``n_new`` tokens only (all by default) as llama.cpp's
    ``common_ngram_cache_update``; n-grams are all within ``tokens``."""
    size = len(tokens)
    n_new = size if n_new is None else n_new
    toks = [int(t) for t in tokens]
    for n in range(ngram_min, ngram_max + 1):
        for i in range(max(size - n_new, n), size):
            part = cache.setdefault(tuple(toks[i - n:i]), {})
            part[toks[i]] = part.get(toks[i], 0) + 1


def _best(part: dict[int, int], weight: Any = None) -> tuple[int, int, int]:
    """(best token, its count, the sum of counts) of a part; ``weight(token)`` multiplies the
    count for the choice. Ties go to the first counted (llama.cpp: std::unordered_map order)."""
    best, best_count, best_score, total = TOKEN_NULL, 0, 0, 0
    for token, count in part.items():
        score = count * (weight(token) if weight else 1)
        if score > best_score:
            best, best_count, best_score = token, count, score
        total += count
    return best, best_count, total


class NgramCache:
    """ngram-cache: llama-lookup's three caches of n-gram -> next-token counts (llama.cpp's
    ``common_speculative_impl_ngram_cache`` and ``common_ngram_cache_draft``), drafting up to 8
    tokens one at a time: the context cache (this history's 1- to 4-grams; the longest n-gram
    with a clear favourite, ``lax`` thresholds), else the dynamic cache (a file of earlier
    generations, strict thresholds), else the static cache's bigram (a corpus file); a token the
    static cache saw after the last two tokens counts 100 times its static count in the choice.

    As in llama.cpp the context cache persists across requests and learns only the n-grams
    inside each batch of new tokens it is given (the prompt and sampled token at the first
    draft, then what was accepted since), and the files are read, never written.

    Parameters
    ----------
    lookup_cache_static, lookup_cache_dynamic
        ``--lookup-cache-static`` / ``--lookup-cache-dynamic`` files (:func:`save_ngram_cache`'s
        format), or caches already loaded.
    """

    N_DRAFT = 8

    def __init__(self, lookup_cache_static: str | PathLike[str] | NgramCounts | None = None,
                 lookup_cache_dynamic: str | PathLike[str] | NgramCounts | None = None) -> None:
        def load(c: Any) -> NgramCounts:
            return {} if c is None else c if isinstance(c, dict) else load_ngram_cache(c)
        self.static = load(lookup_cache_static)
        self.dynamic = load(lookup_cache_dynamic)
        self.context: NgramCounts = {}
        self.cache_size = 0   # history tokens counted into the context cache

    def spawn(self) -> NgramCache:
        return NgramCache(self.static, self.dynamic)

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, history: Sequence[int], n_max: int) -> list[int]:
        size = len(history)
        if self.cache_size < size:
            # one batch: n-grams spanning its start are not counted (as llama.cpp)
            ngram_cache_update(self.context, history[self.cache_size:])
            self.cache_size = size
        if size < NGRAM_STATIC:
            return []
        seq = [int(t) for t in history]
        out: list[int] = []
        while len(out) < self.N_DRAFT:
            static_part = self.static.get(tuple(seq[-NGRAM_STATIC:]), {})
            ngrams = [tuple(seq[-n:]) for n in range(NGRAM_MIN, NGRAM_MAX + 1) if n <= len(seq)]

            def weight(token: int) -> int:
                return 100 * static_part[token] if token in static_part else 1
            token = self._primary(self.context, ngrams, weight, _MIN_SAMPLES_LAX, _MIN_PERCENT_LAX)
            if token == TOKEN_NULL:
                token = self._primary(self.dynamic, ngrams, weight, _MIN_SAMPLES_STRICT, _MIN_PERCENT_STRICT)
            if token == TOKEN_NULL and static_part:
                best, count, total = _best(static_part)
                ok = total >= _MIN_SAMPLES_LAX[NGRAM_STATIC - 1] and \
                    100 * count >= _MIN_PERCENT_LAX[NGRAM_STATIC - 1] * total
                token = best if ok else TOKEN_NULL
            if token == TOKEN_NULL:
                break
            out.append(token)
            seq.append(token)
        return out

    @staticmethod
    def _primary(cache: NgramCounts, ngrams: list[tuple[int, ...]], weight: Any,
                 min_samples: tuple[int, ...], min_percent: tuple[int, ...]) -> int:
        """The favourite after the longest of ``ngrams`` that has a clear one (``try_draft``)."""
        for ngram in reversed(ngrams):
            part = cache.get(ngram)
            if part is None:
                continue
            best, count, total = _best(part, weight)
            i = len(ngram) - 1
            if total >= min_samples[i] and 100 * count >= min_percent[i] * total:
                return best
        return TOKEN_NULL

    def accept(self, n_accepted: int) -> None:
        pass

    def close(self) -> None:
        pass


# the file: per n-gram, its 4 tokens (int32, -1 after the n-gram's end), the number of
# next tokens (int32) and each next token with its count (int32, int32); little-endian
_HEAD = struct.Struct(f"<{NGRAM_MAX}ii")


def save_ngram_cache(cache: NgramCounts, path: str | PathLike[str]) -> None:
    """Write ``cache`` in llama.cpp's ``common_ngram_cache_save`` format (``--lookup-cache-*``)."""
    out = bytearray()
    for ngram, part in cache.items():
        if not 1 <= len(ngram) <= NGRAM_MAX or not part or min(part.values()) < 1:
            raise SpeculationError(f"cannot save n-gram {ngram!r}: {NGRAM_MIN} to {NGRAM_MAX} tokens "
                                   "with positive counts needed")
        out += _HEAD.pack(*ngram, *[TOKEN_NULL] * (NGRAM_MAX - len(ngram)), len(part))
        out += np.array(list(part.items()), dtype="<i4").tobytes()
    Path(path).write_bytes(bytes(out))


def load_ngram_cache(path: str | PathLike[str]) -> NgramCounts:
    """Read a file of :func:`save_ngram_cache` (or llama.cpp's) format; a missing, truncated or
    corrupt file raises :class:`SpeculationError` saying where."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SpeculationError(f"cannot read n-gram cache {path}: {e.strerror}") from None
    cache: NgramCounts = {}
    pos, end = 0, len(data)

    def bad(why: str) -> SpeculationError:
        return SpeculationError(f"{path} is not an n-gram cache: {why} at byte {pos}")

    while pos < end:
        if end - pos < _HEAD.size:
            raise bad("a truncated entry")
        *ngram, ntokens = _HEAD.unpack_from(data, pos)
        size = next((i for i, t in enumerate(ngram) if t == TOKEN_NULL), NGRAM_MAX)
        if size < 1 or any(t != TOKEN_NULL for t in ngram[size:]) or min(ngram[:size]) < 0:
            raise bad(f"n-gram {ngram}")
        if ntokens < 1:
            raise bad(f"{ntokens} next tokens")
        body = pos + _HEAD.size
        if end - body < 8 * ntokens:
            raise bad(f"{ntokens} next tokens but {end - body} bytes left")
        pairs = np.frombuffer(data, dtype="<i4", count=2 * ntokens, offset=body).reshape(ntokens, 2)
        if pairs[:, 1].min() < 1 or pairs[:, 0].min() < 0:
            raise bad("a negative token or a count below 1")
        cache[tuple(ngram[:size])] = dict(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist()))
        pos = body + 8 * ntokens
    return cache


# llama.cpp's flags for the proposers' parameters (arg.cpp): flag, short flag, spec type,
# parameter, type, help (the defaults are the classes')
NGRAM_FLAGS: tuple[tuple[str, str | None, str, str, type, str], ...] = (
    ("--spec-ngram-simple-size-n", None, "ngram-simple", "size_n", int, "n-gram looked up"),
    ("--spec-ngram-simple-size-m", None, "ngram-simple", "size_m", int, "m-gram drafted"),
    ("--spec-ngram-map-k-size-n", None, "ngram-map-k", "size_n", int, "n-gram looked up"),
    ("--spec-ngram-map-k-size-m", None, "ngram-map-k", "size_m", int, "m-gram drafted"),
    ("--spec-ngram-map-k-min-hits", None, "ngram-map-k", "min_hits", int, "key hits before drafting"),
    ("--spec-ngram-map-k4v-size-n", None, "ngram-map-k4v", "size_n", int, "n-gram looked up"),
    ("--spec-ngram-map-k4v-size-m", None, "ngram-map-k4v", "size_m", int, "m-gram drafted"),
    ("--spec-ngram-map-k4v-min-hits", None, "ngram-map-k4v", "min_hits", int, "key hits before drafting"),
    ("--spec-ngram-mod-n-match", None, "ngram-mod", "n_match", int, "n-gram hashed"),
    ("--spec-ngram-mod-n-min", None, "ngram-mod", "n_min", int, "shortest draft"),
    ("--spec-ngram-mod-n-max", None, "ngram-mod", "n_max", int, "longest draft"),
    ("--lookup-cache-static", "-lcs", "ngram-cache", "lookup_cache_static", str, "static n-gram cache file"),
    ("--lookup-cache-dynamic", "-lcd", "ngram-cache", "lookup_cache_dynamic", str, "dynamic n-gram cache file"),
)


def add_ngram_arguments(parser: Any) -> None:
    """Add :data:`NGRAM_FLAGS` to an argparse parser or group (unset: None, the class default)."""
    for flag, short, spec_type, _, kind, what in NGRAM_FLAGS:
        parser.add_argument(*(f for f in (short, flag) if f), type=kind, default=None,
                            metavar="FILE" if kind is str else "N", help=f"{spec_type}: {what}")


def ngram_proposer_from_args(spec_type: str, args: Any) -> Any:
    """:func:`ngram_proposer` with the parameters of ``args`` that :func:`add_ngram_arguments` parsed."""
    return ngram_proposer(spec_type, **{param: getattr(args, flag[2:].replace("-", "_"))
                                        for flag, _, t, param, _, _ in NGRAM_FLAGS if t == spec_type})


def ngram_proposer(spec_type: str, **params: Any) -> Any:
    """The proposer of llama.cpp's ``--spec-type`` name ``spec_type`` (one of
    :data:`NGRAM_SPEC_TYPES`) with its parameters (None: llama.cpp's default)."""
    params = {k: v for k, v in params.items() if v is not None}
    if spec_type == "ngram-simple":
        return NgramSimple(**params)
    if spec_type in ("ngram-map-k", "ngram-map-k4v"):
        return NgramMap(**params, key_only=spec_type == "ngram-map-k")
    if spec_type == "ngram-mod":
        return NgramMod(**params)
    if spec_type == "ngram-cache":
        return NgramCache(**params)
    raise SpeculationError(f"unknown n-gram spec type {spec_type!r}; known: {', '.join(NGRAM_SPEC_TYPES)}")
