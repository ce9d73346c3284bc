"""llama.cpp's n-gram proposers (gguflm.ngram_proposers): hand-built histories give the drafts
that reasoning through llama.cpp's code gives, random call sequences give the drafts of a
line-by-line port of that code, generation with each --spec-type gives exactly the tokens of
generation without it (real and tiny models, greedy and seeded, stop strings; the server's
slots too), and the ngram-cache file round-trips and refuses corruption."""

from __future__ import annotations

import re

import numpy as np
import pytest

import gguflm
from gguflm.cli import _speculative, build_parser
from gguflm.errors import SpeculationError
from gguflm.ngram_proposers import (NgramCache, NgramMap, NgramMod, NgramSimple, load_ngram_cache,
                                    ngram_cache_update, ngram_proposer, save_ngram_cache)
from gguflm.speculative import SlotSpeculation
from tiny_models import TinyModel, write_tiny_model

TYPO_PROMPT = ("Fix the typos in this paragraph:\n\nThe quick brwon fox jumpd over the lazy dog. It was a "
               "sunny day and the fox was veyr happy. The dog did not care at all.\n\nCorrected paragraph:\n")
N_TOKENS = 32
# small sizes, so that a short prompt gives drafts
SMALL = {"ngram-simple": dict(size_n=2, size_m=8), "ngram-map-k": dict(size_n=2, size_m=8),
         "ngram-map-k4v": dict(size_n=2, size_m=8), "ngram-mod": dict(n_match=3, n_min=1, n_max=8),
         "ngram-cache": {}}


# -- hand-built histories; `history` is llama.cpp's prompt followed by the sampled token (id_last)

def test_ngram_simple_by_hand():
    s = NgramSimple(size_n=2, size_m=3)
    # prompt [9,1,2,3,4,8,8,8,1] (cur_len 9 > n+m+1), sampled 2: pattern [1,2]; starts 6..1 are
    # searched latest first and [1,2] is at 1, so the m=3 tokens after it: [3,4,8]
    assert s.propose([9, 1, 2, 3, 4, 8, 8, 8, 1, 2], 16) == [3, 4, 8]
    # [1,2] at 1 and 4: the latest (4) wins -> prompt[6:9]
    assert s.propose([9, 1, 2, 3, 1, 2, 4, 4, 4, 1, 2], 16) == [4, 4, 4]
    # the only match is at 6: min(m, cur_len - (6+2)) = 1 token < size_n -> no draft
    assert s.propose([5, 6, 7, 8, 9, 0, 1, 2, 1, 2], 16) == []
    # history too short: cur_len 6 <= n+m+1
    assert s.propose([1, 2, 3, 1, 2, 1, 2], 16) == []


def test_ngram_map_k_by_hand_cuts_a_key_to_what_was_accepted():
    m = NgramMap(size_n=2, size_m=3, key_only=True)
    prompt = [9, 1, 2, 3, 4, 8, 8, 8, 1]
    m.begin(prompt)
    # cur_len 9 >= 2n+m; key [1,2]; the index is empty, the prompt's starts 3..1 are searched
    # (size_last_begin - n - m - 1 = 3 down), [1,2] at 1 -> prompt[3:6]
    assert m.propose(prompt + [2], 16) == [3, 4, 8]
    m.accept(1)
    # later the same key comes from the index (start 1) and drafts min(m, 1 accepted) token
    assert m.propose(prompt + [2, 3, 4, 8, 8, 8, 1, 2], 16) == [3]


def test_ngram_map_k4v_by_hand_drafts_a_clear_favourite_only():
    m = NgramMap(size_n=2, size_m=3, key_only=False)
    # [1,2] is followed by [3,3,3] at 1 and 11, by [4,4,4] at 6; the match is the latest (11):
    # counts 2 against 1, 2 >= 2*1 -> the tokens after the match
    prompt = [9, 1, 2, 3, 3, 3, 1, 2, 4, 4, 4, 1, 2, 3, 3, 3, 0, 0, 0, 0, 1]
    m.begin(prompt)
    assert m.propose(prompt + [2], 16) == [3, 3, 3]
    # once each: 1 < 2*1 -> nothing (ngram-map-k would draft the latest, [4,4,4])
    prompt = [9, 1, 2, 3, 3, 3, 1, 2, 4, 4, 4, 0, 0, 0, 0, 1]
    for key_only, want in ((False, []), (True, [4, 4, 4])):
        m = NgramMap(size_n=2, size_m=3, key_only=key_only)
        m.begin(prompt)
        assert m.propose(prompt + [2], 16) == want
    # min_hits 2: the key's first hit drafts nothing, its second does
    m = NgramMap(size_n=2, size_m=3, min_hits=2, key_only=False)
    prompt = [9, 1, 2, 3, 3, 3, 1, 2, 3, 3, 3, 0, 0, 0, 0, 1]
    m.begin(prompt)
    assert m.propose(prompt + [2], 16) == []
    assert m.propose(prompt + [2], 16) == [3, 3, 3]


def test_ngram_mod_by_hand():
    # n_match 2: begin adds (5,6)->7, (6,7)->5, (7,5)->6, (5,6)->8 (the later write wins),
    # (6,8)->1, (8,1)->5; drafting from (5,6): 8, then (6,8) 1, (8,1) 5, (1,5) empty -> 3 tokens
    prompt = [5, 6, 7, 5, 6, 8, 1, 5]
    for n_min, want in ((1, [8, 1, 5]), (3, [8, 1, 5]), (4, [])):
        mod = NgramMod(n_match=2, n_min=n_min, n_max=6)
        mod.begin(prompt)
        assert mod.propose(prompt + [6], 16) == want
    mod = NgramMod(n_match=2, n_min=1, n_max=2)
    mod.begin(prompt)
    assert mod.propose(prompt + [6], 16) == [8, 1]


def test_ngram_cache_by_hand():
    # context counts of [7,8,7,9]: (7)->{8,9} once each; the last token 9 and (7,9) were never
    # followed by anything -> no draft
    assert NgramCache().propose([7, 8, 7, 9], 8) == []
    # the static bigram (7,9) saw 4 three times in four: >= 2 samples and >= 50% -> 4; then
    # nothing knows (9,4)
    assert NgramCache({(7, 9): {4: 3, 5: 1}}).propose([7, 8, 7, 9], 8) == [4]
    # (1) is followed by 2 twice and 3 once: 2 of 3 >= 66% with >= 2 samples -> 2 ((0,1) came
    # before 2 once: 1 sample < 2, the shorter n-gram is tried)
    history = [1, 2, 0, 1, 2, 5, 1, 3, 0, 1]
    assert NgramCache().propose(history, 8)[:1] == [2]
    # a static count for 3 after (0,1) weighs 3 100x: 3 is chosen, but 1 of 3 < 66% -> nothing
    assert NgramCache({(0, 1): {3: 1}}).propose(history, 8) == []
    # (4,5,6) saw 2 and 3 once each (>= 1 sample, 50% each): the static bigram (5,6) decides
    history = [4, 5, 6, 2, 4, 5, 6, 3, 9, 4, 5, 6]
    assert NgramCache({(5, 6): {3: 1}}).propose(history, 8)[:1] == [3]
    assert NgramCache({(5, 6): {2: 1}}).propose(history, 8)[:1] == [2]
    # the dynamic cache needs the strict share: (6) -> 4 in 2 of 3 (< 75%) no, 3 of 4 yes
    assert NgramCache(None, {(6,): {4: 2, 5: 1}}).propose([9, 6], 8) == []
    assert NgramCache(None, {(6,): {4: 3, 5: 1}}).propose([9, 6], 8) == [4]


# -- a line-by-line port of llama.cpp's code, to compare on random call sequences

class _PortMap:
    """common_ngram_map_begin / _draft / _accept as written in ngram-map.cpp."""

    def __init__(self, n, m, min_hits, key_only):
        self.n, self.m, self.min_hits, self.key_only = n, m, min_hits, key_only
        self.keys = []
        self.key_map = [0] * 262144
        self.key_map_last_idx = self.size_last_begin = self.idx_last_check = 0
        self.last = None

    def hash(self, t, start):
        h = 0
        for i in range(self.n):
            h = (h * 2654435761 + t[start + i]) % 2 ** 32
        return h % len(self.key_map)

    def begin(self, tokens):
        n, m, size_begin = self.n, self.m, len(tokens)
        cleanup = self.size_last_begin
        if cleanup > size_begin:
            cleanup = size_begin - n - m if size_begin > n + m else 0
        if size_begin < self.idx_last_check:
            for i, k in enumerate(self.key_map):
                if k != 0 and k >= cleanup:
                    self.key_map[i] = 0
            self.key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
            for i in range(len(self.keys) - 1, -1, -1):
                key = self.keys[i]
                if key["key_idx"] >= cleanup:
                    del self.keys[i]
                    continue
                if self.key_only:
                    continue
                for j in range(3, -1, -1):
                    v = key["values"][j]
                    if v[0] != 0 and v[0] >= cleanup:
                        for k in range(j, 3):
                            key["values"][k] = list(key["values"][k + 1])
                        key["values"][3][0] = key["values"][3][1] = 0
                if key["values"][0][0] == 0:
                    del self.keys[i]
        self.idx_last_check = self.size_last_begin = size_begin

    def matches(self, inp, j, key):
        return all(inp[j + k] == key[k] for k in range(self.n))

    def draft(self, inp, sampled):
        self.last = None
        n, m, cur_len = self.n, self.m, len(inp)
        if cur_len < 2 * n + m:
            return []
        self.idx_last_check = cur_len
        key = inp[cur_len - n + 1:] + [sampled]
        match = 0
        idx = self.key_map[self.hash(key, 0)]
        if idx != 0 and idx < cur_len - n - m - 1 and self.matches(inp, idx, key):
            match = idx
        if match == 0 and self.size_last_begin > n + m + 1:
            j = self.size_last_begin - n - m - 1
            while j > self.key_map_last_idx:
                if self.matches(inp, j, key):
                    match = j
                    break
                j -= 1
        if match == 0:
            j = cur_len - n - m - 1
            while j > self.size_last_begin and j > self.key_map_last_idx:
                if self.matches(inp, j, key):
                    match = j
                    break
                j -= 1
        if self.size_last_begin > n + m + 1:
            j = self.size_last_begin - n - m - 1
            while j > self.key_map_last_idx:
                if self.key_map[self.hash(inp, j)] == 0:
                    self.key_map[self.hash(inp, j)] = j
                j -= 1
        j = cur_len - n - m - 1
        while j > self.size_last_begin and j > self.key_map_last_idx:
            if self.key_map[self.hash(inp, j)] == 0:
                self.key_map[self.hash(inp, j)] = j
            j -= 1
        self.key_map_last_idx = max(cur_len - n - m - 1, self.key_map_last_idx)
        if match == 0:
            return []
        offset = next((i for i, k in enumerate(self.keys) if self.matches(inp, k["key_idx"], key)), len(self.keys))
        if offset == len(self.keys):
            self.keys.append({"key_idx": match, "stat_idx": 0, "key_num": 0, "values": [[0, 0, m] for _ in range(4)]})
        cur = self.keys[offset]
        cur["key_num"] = min(cur["key_num"] + 1, 16380)
        if self.key_only:
            self.last = (offset, 0)
            return inp[match + n:match + n + min(m, cur["values"][0][2])]
        if cur["key_num"] < self.min_hits:
            return []
        for i in range(cur["stat_idx"], match + 1):
            if not self.matches(inp, i, key):
                continue
            found = -1
            for v in range(4):
                val = cur["values"][v]
                if val[0] == 0:
                    val[0], val[1], val[2] = i + n, 0, m
                    found = v
                    break
                if inp[i + n:i + n + m] == inp[val[0]:val[0] + m]:
                    found = v
                    break
            if found >= 0:
                cur["values"][found][1] = min(cur["values"][found][1] + 1, 16380)
        cur["stat_idx"] = match
        max_occur, slot = 0, 0
        for v in range(4):
            if cur["values"][v][1] > max_occur:
                max_occur, slot = cur["values"][v][1], v
        others = sum(cur["values"][v][1] for v in range(4) if v != slot)
        if others > 0 and max_occur < 2 * others:
            return []
        self.last = (offset, slot)
        return inp[match + n:match + n + min(m, cur["values"][slot][2])]

    def accept(self, n_accepted):
        if self.last is not None:
            self.keys[self.last[0]]["values"][self.last[1]][2] = n_accepted


class _PortMod:
    """common_ngram_mod and common_speculative_impl_ngram_mod as written."""

    def __init__(self, n, n_min, n_max):
        self.n, self.n_min, self.n_max = n, n_min, n_max
        self.entries: dict[int, int] = {}
        self.i_last = self.n_draft_last = self.n_low = 0

    def idx(self, t, start):
        res = 0
        for i in range(self.n):
            res = (res * 6364136223846793005 + t[start + i]) % 2 ** 64
        return res % (4 * 1024 * 1024)

    def begin(self, prompt):
        self.i_last = self.n_draft_last = 0
        if len(prompt) < self.n:
            return
        for i in range(len(prompt) - self.n):
            self.entries[self.idx(prompt, i)] = prompt[i + self.n]
        self.i_last = len(prompt) - self.n

    def draft(self, prompt, sampled):
        self.n_draft_last = 0
        n, cur_len = self.n, len(prompt)
        if cur_len < n:
            return []
        if self.i_last + 32 < cur_len:
            for i in range(self.i_last, cur_len - n):
                self.entries[self.idx(prompt, i)] = prompt[i + n]
            self.i_last = cur_len - n
        result = prompt[cur_len - n + 1:] + [sampled]
        for i in range(self.n_max):
            token = self.entries.get(self.idx(result, i), -1)
            if token == -1:
                if i < self.n_min:
                    return []
                break
            result.append(token)
        self.n_draft_last = len(result) - n
        return result[n:]

    def accept(self, n_accepted):
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < 0.25:
                self.n_low += 1
                if self.n_low >= 5:
                    self.entries.clear()
                    self.n_low = self.i_last = 0
            else:
                self.n_low = 0


class _PortSimple:
    def __init__(self, n, m):
        self.n, self.m = n, m

    def begin(self, prompt):
        pass

    def draft(self, tokens, sampled):
        n, m, cur_len = self.n, self.m, len(tokens)
        if cur_len <= n + m + 1:
            return []
        pattern = tokens[cur_len - n + 1:] + [sampled]
        for j in range(cur_len - n - 1, 0, -1):
            if tokens[j:j + n] == pattern:
                copy = min(m, cur_len - (j + n))
                return tokens[j + n:j + n + copy] if copy >= n else []
        return []

    def accept(self, n_accepted):
        pass


class _PortCache:
    """common_speculative_impl_ngram_cache's draft_one with common_ngram_cache_draft."""

    LAX = ((2, 2, 1, 1), (66, 50, 50, 50))
    STRICT = ((4, 3, 2, 2), (75, 66, 66, 66))

    def __init__(self, static=None, dynamic=None):
        self.context, self.static, self.dynamic = {}, static or {}, dynamic or {}
        self.cache_size = 0

    def begin(self, prompt):
        pass

    @staticmethod
    def try_primary(cache, ngrams, part_static, thresholds):
        for i in range(len(ngrams) - 1, -1, -1):
            part = cache.get(ngrams[i])
            if part is None:
                continue
            max_c, max_s, total, best = 0, 0, 0, -1
            for token, c in part.items():
                s = 100 * part_static[token] if token in part_static else 1
                if c * s > max_c * max_s:
                    best, max_c, max_s = token, c, s
                total += c
            if total < thresholds[0][i] or 100 * max_c < thresholds[1][i] * total:
                continue
            return best
        return -1

    def draft(self, prompt, sampled):
        if self.cache_size < len(prompt) + 1:
            new = prompt[self.cache_size:] + [sampled]
            for size in range(1, 5):
                for i in range(size, len(new)):
                    part = self.context.setdefault(tuple(new[i - size:i]), {})
                    part[new[i]] = part.get(new[i], 0) + 1
            self.cache_size = len(prompt) + 1
        inp, draft = prompt + [sampled], []
        if len(inp) < 2:
            return []
        while len(draft) < 8:
            seq = inp + draft
            part_static = self.static.get(tuple(seq[-2:]), {})
            ngrams = [tuple(seq[-size:]) for size in range(1, 5)]
            token = self.try_primary(self.context, ngrams, part_static, self.LAX)
            if token == -1:
                token = self.try_primary(self.dynamic, ngrams, part_static, self.STRICT)
            if token == -1 and part_static:
                best = max(part_static, key=part_static.get)
                total = sum(part_static.values())
                if total >= 2 and 100 * part_static[best] >= 50 * total:
                    token = best
            if token == -1:
                break
            draft.append(token)
        return draft

    def accept(self, n_accepted):
        pass


def _random_session(rng, ours, port, n_prompt, n_steps, alphabet):
    """Drive both through a generation: begin, then per step propose, accept a random part and
    extend the history by it and one more token; return the drafts seen."""
    text = rng.integers(0, alphabet, size=n_prompt + 4 * n_steps).tolist()
    # a copied stretch, so that long keys recur
    text[n_prompt // 2:n_prompt // 2 + 12] = text[:12]
    prompt = text[:n_prompt]
    ours.begin(prompt)
    port.begin(prompt)
    history, drafts = prompt + [text[n_prompt]], []
    for _ in range(n_steps):
        want = port.draft(history[:-1], history[-1])
        got = ours.propose(history, 1024)
        assert got == want, (history, got, want)
        drafts.append(got)
        if got:
            n_acc = int(rng.integers(0, len(got) + 1))
            ours.accept(n_acc)
            port.accept(n_acc)
            history = history + got[:n_acc]
        history = history + [int(rng.integers(0, alphabet))]
    return history, drafts


@pytest.mark.parametrize("kind", ["simple", "map-k", "map-k4v", "mod", "cache"])
def test_random_call_sequences_match_a_port_of_llama_cpp(kind):
    rng = np.random.default_rng(11)
    n_drafts = 0
    for trial in range(12):
        n, m, alphabet = int(rng.integers(1, 4)), int(rng.integers(1, 6)), int(rng.integers(2, 6))
        if kind == "simple":
            ours, port = NgramSimple(n, m), _PortSimple(n, m)
        elif kind.startswith("map"):
            hits, key_only = int(rng.integers(1, 3)), kind == "map-k"
            ours, port = NgramMap(n, m, hits, key_only), _PortMap(n, m, hits, key_only)
        elif kind == "mod":
            n_min, n_max = int(rng.integers(0, 3)), int(rng.integers(1, 10))
            ours, port = NgramMod(n, n_min, n_max), _PortMod(n, n_min, n_max)
        else:
            static = {}
            ngram_cache_update(static, rng.integers(0, alphabet, size=80).tolist(), 2, 2)
            ours, port = NgramCache(static), _PortCache(static)
        history, drafts = _random_session(rng, ours, port, int(rng.integers(5, 40)), 40, alphabet)
        n_drafts += sum(map(bool, drafts))
        # a second request on the same proposer: a shorter prompt (a cut history), then a longer one
        for cut in (len(history) // 3, len(history) + 5):
            prompt = (history + rng.integers(0, alphabet, size=8).tolist())[:cut]
            ours.begin(prompt)
            port.begin(prompt)
            h = prompt + [int(rng.integers(0, alphabet))]
            for _ in range(10):   # within a request the history only grows
                want = port.draft(h[:-1], h[-1])
                assert ours.propose(h, 1024) == want
                if want:
                    ours.accept(len(want) // 2)
                    port.accept(len(want) // 2)
                h = h + want[:len(want) // 2] + [int(rng.integers(0, alphabet))]
    assert n_drafts > 20   # the sequences did draft


def test_ngram_mod_slots_share_one_table_and_low_acceptance_clears_it():
    mod = NgramMod(n_match=2, n_min=1, n_max=4)
    other = mod.spawn()
    assert other.table is mod.table
    mod.begin([5, 6, 7, 5, 6, 8])
    assert other.propose([1, 5, 6], 4) == [8]   # the other slot sees the first one's prompt
    for _ in range(5):
        assert other.propose([1, 5, 6], 4) == [8]
        other.accept(0)
    assert other.propose([1, 5, 6], 4) == [] and mod.table.used == 0


# -- the ngram-cache file

def test_ngram_cache_file_round_trips_and_reads_llama_cpp_layout(tmp_path):
    cache: dict = {}
    ngram_cache_update(cache, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 1, 4, 1], 1, 4)
    path = tmp_path / "lookup.bin"
    save_ngram_cache(cache, path)
    assert load_ngram_cache(path) == cache
    # llama.cpp's layout: 4 int32 tokens (-1 padded), int32 count, (token, count) int32 pairs
    raw = np.frombuffer(path.read_bytes(), dtype="<i4")
    first_ngram, first_part = next(iter(cache.items()))
    want = list(first_ngram) + [-1] * (4 - len(first_ngram)) + [len(first_part)]
    for token, count in first_part.items():
        want += [token, count]
    assert raw[:len(want)].tolist() == want
    assert sum(5 + 2 * len(p) for p in cache.values()) == raw.shape[0]
    # and a proposer reads it as its static cache
    assert NgramCache(path).static == cache


@pytest.mark.parametrize("damage", ["truncated", "zero-tokens", "bad-count", "missing"])
def test_a_corrupt_ngram_cache_file_is_a_clear_error(tmp_path, damage):
    path = tmp_path / "lookup.bin"
    save_ngram_cache({(1, 2): {3: 4, 5: 6}}, path)
    raw = np.frombuffer(path.read_bytes(), dtype="<i4").copy()
    if damage == "truncated":
        path.write_bytes(raw.tobytes()[:-3])
    elif damage == "zero-tokens":
        raw[4] = 0
        path.write_bytes(raw.tobytes())
    elif damage == "bad-count":
        raw[6] = -2
        path.write_bytes(raw.tobytes())
    else:
        path.unlink()
    with pytest.raises(SpeculationError, match="n-gram cache"):
        load_ngram_cache(path)
    with pytest.raises(SpeculationError, match="n-gram cache"):
        NgramCache(lookup_cache_dynamic=path)


# -- generation: the tokens of generation without speculation

SAMPLINGS = ({"temperature": 0.0}, {"temperature": 0.8, "seed": 7})


@pytest.fixture(scope="module")
def smollm(smollm_path):
    """An LLM factory (one thread: drafts are checked alike at any count) and the completions
    without speculation: per sampling, the whole reply and the reply cut by a stop string
    inside the copied stretch."""
    kw = dict(n_ctx=512, n_threads=1)
    with gguflm.LLM(smollm_path, **kw) as plain:
        expected = []
        for sampling in SAMPLINGS:
            whole = plain.complete(TYPO_PROMPT, max_tokens=N_TOKENS, **sampling)
            stop = whole.text[len(whole.text) // 2:len(whole.text) // 2 + 4]
            expected.append((sampling, whole, stop, plain.complete(TYPO_PROMPT, max_tokens=N_TOKENS, stop=stop,
                                                                     **sampling)))
    return (lambda draft: gguflm.LLM(smollm_path, draft_model=draft, draft_max=8, **kw)), expected


@pytest.mark.parametrize("spec_type", list(SMALL))
def test_each_spec_type_gives_the_tokens_of_generation_without_it(smollm, spec_type):
    make, expected = smollm
    drafted = accepted = 0
    with make(ngram_proposer(spec_type, **SMALL[spec_type])) as llm:
        for sampling, whole, stop, cut in expected:
            got = llm.complete(TYPO_PROMPT, max_tokens=N_TOKENS, **sampling)
            assert (got.token_ids, got.text, got.finish_reason) == (whole.token_ids, whole.text, whole.finish_reason)
            drafted, accepted = drafted + got.timings.draft_n, accepted + got.timings.draft_accepted
            got = llm.complete(TYPO_PROMPT, max_tokens=N_TOKENS, stop=stop, **sampling)
            assert (got.token_ids, got.text, got.finish_reason) == (cut.token_ids, cut.text, "stop")
    assert 0 < accepted <= drafted


def test_each_spec_type_on_a_tiny_model(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_model(TinyModel("llama", n_embd=32, head_dim=8, n_ff=32, n_layer=1), path, np.random.default_rng(3))
    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7]
    with gguflm.LLM(path, n_ctx=128, n_threads=1) as plain:
        want = {s: plain.complete(prompt, max_tokens=24, temperature=t, seed=3).token_ids
                for s, t in (("greedy", 0.0), ("seeded", 1.0))}
    for spec_type, params in SMALL.items():
        with gguflm.LLM(path, n_ctx=128, n_threads=1, draft_model=ngram_proposer(spec_type, **params),
                        draft_max=4) as llm:
            for s, t in (("greedy", 0.0), ("seeded", 1.0)):
                assert llm.complete(prompt, max_tokens=24, temperature=t, seed=3).token_ids == want[s], spec_type


def test_the_server_with_a_spec_type_gives_the_same_replies(smollm_path):
    from test_server_speculative import replies
    expected, _ = replies(smollm_path)
    # ngram-mod: per-slot proposers on one shared table
    got, counts = replies(smollm_path, draft_model=ngram_proposer("ngram-mod", **SMALL["ngram-mod"]), draft_max=8)
    assert got == expected
    assert counts["accepted"] > 0


def test_slots_get_proposers_of_their_own_sharing_what_llama_cpp_shares():
    for proposer in (NgramSimple(), NgramMap(), NgramMod(), NgramCache({(1, 2): {3: 2}})):
        slots = SlotSpeculation(proposer, None, 2)
        a, b = (s.proposer for s in slots.slots)
        assert a is not b and type(a) is type(proposer)
        if isinstance(proposer, NgramMod):
            assert a.table is b.table
        if isinstance(proposer, NgramCache):
            assert a.static is b.static and a.context is not b.context
        slots.close()


def test_run_and_serve_take_llama_cpp_spec_flags(tmp_path):
    for command in ("run", "serve"):
        args = build_parser().parse_args([command, "--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "3",
                                          "--spec-ngram-map-k4v-min-hits", "2", "--spec-ngram-map-k-size-n", "5"])
        draft = _speculative(args)["draft_model"]
        assert isinstance(draft, NgramMap) and not draft.key_only
        assert (draft.size_n, draft.size_m, draft.min_hits) == (3, 48, 2)
    args = build_parser().parse_args(["run", "--spec-type", "ngram-mod", "--spec-ngram-mod-n-min", "4"])
    draft = _speculative(args)["draft_model"]
    assert (draft.n_match, draft.n_min, draft.n_max) == (24, 4, 64)
    path = tmp_path / "static.bin"
    save_ngram_cache({(1, 2): {3: 2}}, path)
    args = build_parser().parse_args(["serve", "--spec-type", "ngram-cache", "-lcs", str(path)])
    assert _speculative(args)["draft_model"].static == {(1, 2): {3: 2}}
    args = build_parser().parse_args(["serve", "--spec-type", "ngram-cache", "-lcd", str(tmp_path / "none.bin")])
    with pytest.raises(SpeculationError, match="cannot read"):
        _speculative(args)
    # the existing `ngram` is still prompt lookup
    from gguflm.speculative import PromptLookup
    assert isinstance(_speculative(build_parser().parse_args(["run", "--spec-type", "ngram"]))["draft_model"],
                      PromptLookup)


def test_gguflm_run_and_bench_with_a_spec_type(smollm_path):
    from test_speculative import _cli

    common = ("run", "-m", str(smollm_path), "-p", TYPO_PROMPT, "-n", "24", "--temp", "0", "-t", "1", "-c", "512")
    plain = _cli(*common)
    done = _cli(*common, "--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "2",
                "--spec-ngram-map-k-size-m", "8", "--draft-max", "8")
    assert plain.returncode == 0 and done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout
    accepted, drafted = map(int, re.search(r"draft: (\d+)/(\d+) accepted", done.stderr).groups())
    assert 0 < accepted <= drafted
    done = _cli("bench", "--speculative", "-m", str(smollm_path), "-n", "12", "-r", "1", "-t", "1", "--tasks", "json",
                "--spec-type", "ngram-mod,ngram-cache", "--spec-ngram-mod-n-match", "3", "--spec-ngram-mod-n-min", "1")
    assert done.returncode == 0, done.stderr
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in done.stdout.splitlines()
            if line.startswith("| json")]
    assert [r[1] for r in rows] == ["gguflm", "gguflm + ngram-mod", "gguflm + ngram-cache"]
    assert [r[5] for r in rows[1:]] == ["yes", "yes"]
    bad = _cli("bench", "--speculative", "-m", str(smollm_path), "--spec-type", "ngram-huge")
    assert bad.returncode == 2 and "ngram-huge" in bad.stderr
