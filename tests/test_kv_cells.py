"""Where the KV cache puts each token, as llama.cpp's cache puts it.

A cell's index decides which lane of attention's float sums its value joins (lane = cell % lanes),
so the same prompt in other cells gives other logits: to give llama.cpp's logits a context must
also place tokens where llama.cpp does. llama.cpp searches for free cells from a head that stays
past the last cell a ubatch took, and an operation that frees cells (``seq_rm``, ``seq_keep``, a
``seq_add`` that pushes positions below 0) moves the head back to the first cell it freed: a new
prompt after ``seq_rm(0, 0, -1)`` starts at cell 0, not after the old request's cells.

With one region per sequence (``kv_unified=False``, llama.cpp's KV streams) the head is per region,
the sequence operations look at the sequence's own region, and ggml multiplies each region's tokens
apart: a token takes the batched (sgemm) rounding of its attention only when its own sequence has two
or more tokens in the ubatch, so parallel slots of one token each round as each would alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from _llama import LlamaDecoder, require_peer
from gguflm import Batch, Context, Model, system
from gguflm.system import ARITHMETICS
from gguflm.kv_cache import KVCache

CACHE_TYPE_IDS = {"f32": 0, "f16": 1, "q8_0": 8}


def _cache(size: int = 64, n_seq_max: int = 1, n_stream: int = 1) -> KVCache:
    return KVCache(size, [0], lambda il: 32, lambda il: 32, "f32", "f32", n_seq_max, n_stream=n_stream)


def _place(cache: KVCache, n: int, seq: int = 0, start: int | None = None) -> np.ndarray:
    first = cache.seq_pos_max(seq) + 1 if start is None else start
    cells = cache.find_slot(n, np.full(n, seq, np.int32))
    cache.apply(cells, np.arange(first, first + n, dtype=np.int32), np.full(n, 1 << seq, np.uint64))
    return cells


def test_freeing_cells_moves_the_head_back_to_the_first_freed():
    cache = _cache()
    _place(cache, 40)
    assert cache.head == 40
    cache.seq_rm(0, 50, -1)                 # frees nothing: the head stays
    assert cache.head == 40
    cache.seq_rm(0, 25, -1)
    assert cache.head == 25
    assert list(_place(cache, 3)) == [25, 26, 27]
    cache.seq_rm(0, 0, -1)                  # a new prompt starts at cell 0
    assert cache.head == 0 and list(_place(cache, 2)) == [0, 1]
    cache.seq_rm(0, 1, 2)                   # a hole before the head: never moves it forward
    assert cache.head == 1
    _place(cache, 64 - cache.n_used)        # full: the head rests at the end, not at 0
    assert cache.head == 64 and cache.n_used == 64
    cache.seq_add(0, 0, 3, -2)              # positions 0 and 1 fall below 0 and go: cells 0 and 2
    assert cache.n_used == 62 and cache.head == 0
    cache.seq_add(0, 10, -1, 5)             # a shift that frees nothing restarts the search at 0
    assert cache.head == 0


def test_regions_keep_their_own_heads_and_operations():
    cache = _cache(size=128, n_seq_max=2, n_stream=2)
    _place(cache, 30, seq=0)
    _place(cache, 20, seq=1)
    assert list(cache.heads) == [30, 20]
    cache.seq_rm(0, 10, -1)
    assert list(cache.heads) == [10, 20]
    cache.seq_keep(0)                       # llama.cpp's seq_keep looks at sequence 0's region only
    assert cache.seq_pos_max(1) == 19
    cache.seq_cp(0, 1, -1, -1)              # across regions: region 1 becomes a copy of region 0
    assert list(cache.heads) == [10, 10] and cache.seq_pos_max(1) == 9
    assert list(np.flatnonzero(cache.seq == 2)) == list(range(64, 74))
    with pytest.raises(ValueError, match="whole sequences"):
        cache.seq_cp(0, 1, 3, -1)


def _decode(ctx: Context, entries: list[tuple[int, int, int, bool]]) -> tuple[np.ndarray, dict[int, int]]:
    """Decode (token, position, sequence, output) entries as one batch; the output rows and each
    touched region's head before the decode."""
    cache = ctx.memory.caches[0]
    heads = {cache._stream_of(seq): int(cache.heads[cache._stream_of(seq)]) for _, _, seq, _ in entries}
    batch = Batch(len(entries), n_seq_max=1)
    for tok, pos, seq, out in entries:
        batch.add(tok, pos, [seq], out)
    assert ctx.decode(batch) == 0
    return np.stack([ctx.get_logits_ith(i) for i, e in enumerate(entries) if e[3]]), heads


def _prompt(tokens, seq: int = 0, start: int = 0) -> list[tuple[int, int, int, bool]]:
    return [(int(t), start + i, seq, i == len(tokens) - 1) for i, t in enumerate(tokens)]


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("n_seq_max,kv_unified", [(1, True), (2, False)], ids=["one region", "two regions"])
def test_cells_and_logits_follow_llama_cpp_through_sequence_operations(smollm_path, cache_type, n_seq_max,
                                                                       kv_unified):
    """Unrelated prompts one after another (as a chat client or a server slot sends them), a
    follow-up that keeps a prefix, a context shift, positions pushed below 0, a second sequence
    and seq_keep: after every step the head each decode started from, the positions each sequence
    holds and the logits, bit for bit, are llama.cpp's."""
    require_peer()
    rng = np.random.default_rng(5)
    prompts = [list(rng.integers(3, 40000, n)) for n in (37, 23, 9, 29)]
    model = Model.load(smollm_path)
    peer = LlamaDecoder(smollm_path, n_ctx=1024, n_batch=256, type_k=CACHE_TYPE_IDS[cache_type],
                        type_v=CACHE_TYPE_IDS[cache_type], n_seq_max=n_seq_max, kv_unified=kv_unified,
                        heads=True)
    ctx = Context(model, n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=n_seq_max, kv_unified=kv_unified,
                  type_k=cache_type, type_v=cache_type, n_threads=2)
    step = 0

    def both(entries, what):
        nonlocal step
        ours, heads = _decode(ctx, entries)
        theirs = peer.decode_batch(entries)
        assert heads == peer.heads[-1], (what, step)
        assert (ours.view(np.uint32) == theirs.view(np.uint32)).all(), (what, step, np.abs(ours - theirs).max())
        for seq in range(n_seq_max):
            assert ctx.memory.seq_pos_min(seq) == peer.seq_pos_min(seq), (what, seq)
            assert ctx.memory.seq_pos_max(seq) == peer.seq_pos_max(seq), (what, seq)
        step += 1

    def generate(n, seq=0, what="step"):
        for _ in range(n):
            pos = ctx.memory.seq_pos_max(seq) + 1
            both([(int(rng.integers(3, 40000)), pos, seq, True)], what)

    def op(name, *args):
        getattr(ctx.memory, name)(*args)
        getattr(peer, name)(*args)

    try:
        both(_prompt(prompts[0]), "first prompt")
        generate(3)
        op("seq_rm", 0, 0, -1)                          # an unrelated request: cells from 0 again
        both(_prompt(prompts[1]), "second prompt")
        generate(2)
        op("seq_rm", 0, 12, -1)                         # a follow-up turn keeps 12 positions
        both(_prompt(prompts[2], start=12), "follow-up")
        generate(1)
        op("seq_rm", 0, 4, 9)                           # a context shift: drop 5, move the rest down
        op("seq_add", 0, 9, -1, -5)
        generate(2, what="after the shift")
        op("seq_add", 0, 0, 3, -10)                     # positions 0-2 fall below 0
        generate(2, what="after positions below 0")
        if n_seq_max > 1:
            both(_prompt(prompts[3], seq=1), "second sequence")
            both([(7, ctx.memory.seq_pos_max(0) + 1, 0, True), (8, ctx.memory.seq_pos_max(1) + 1, 1, True)],
                 "both sequences")
            op("seq_keep", 0)
            generate(1, what="after seq_keep")
            generate(1, seq=1, what="the kept other region")
    finally:
        peer.close()
        ctx.close()
        model.close()


# a Q8_0 cache's K·q are integer dots, the same in every arithmetic: one of them suffices
@pytest.mark.parametrize("cache_type,arithmetic", [(c, a) for c in ("f32", "f16") for a in ARITHMETICS] +
                         [("q8_0", ARITHMETICS[0])])
def test_parallel_slots_round_as_each_alone(smollm_path, cache_type, arithmetic):
    """Four sequences in their own regions, then steps of one token each in one batch (a server's
    parallel slots): every row equals that sequence's logits decoded alone, bit for bit, past 64
    cells (the widest lanes of any arithmetic's sums)."""
    rng = np.random.default_rng(11)
    prompts = [list(rng.integers(3, 40000, n)) for n in (70, 81, 66, 90)]
    steps = rng.integers(3, 40000, (6, 4))
    model = Model.load(smollm_path)
    kwargs = dict(n_ctx=1024, n_seq_max=4, kv_unified=False, type_k=cache_type, type_v=cache_type, n_threads=2)
    try:
        with system.using(arithmetic=arithmetic):
            together = Context(model, **kwargs)
            for s, p in enumerate(prompts):
                _decode(together, _prompt(p, seq=s))
            rows = [_decode(together, [(int(steps[i, s]), len(prompts[s]) + i, s, True) for s in range(4)])[0]
                    for i in range(len(steps))]
            together.close()
            for s, p in enumerate(prompts):
                alone = Context(model, **kwargs)
                _decode(alone, _prompt(p, seq=s))
                for i in range(len(steps)):
                    row = _decode(alone, [(int(steps[i, s]), len(p) + i, s, True)])[0][0]
                    assert (row.view(np.uint32) == rows[i][s].view(np.uint32)).all(), (s, i)
                alone.close()
    finally:
        model.close()


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
def test_parallel_slots_equal_llama_cpps_streams(smollm_path, cache_type):
    """The same steps through llama.cpp's non-unified cache (each stream's products apart): the
    logits of every row, bit for bit."""
    require_peer()
    rng = np.random.default_rng(12)
    prompts = [list(rng.integers(3, 40000, n)) for n in (70, 81, 66, 90)]
    model = Model.load(smollm_path)
    peer = LlamaDecoder(smollm_path, n_ctx=1024, n_batch=256, type_k=CACHE_TYPE_IDS[cache_type],
                        type_v=CACHE_TYPE_IDS[cache_type], n_seq_max=4, kv_unified=False)
    ctx = Context(model, n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=4, kv_unified=False, type_k=cache_type,
                  type_v=cache_type, n_threads=2)
    try:
        for s, p in enumerate(prompts):
            entries = _prompt(p, seq=s)
            ours, theirs = _decode(ctx, entries)[0], peer.decode_batch(entries)
            assert (ours.view(np.uint32) == theirs.view(np.uint32)).all(), ("prompt", s)
        for i in range(5):
            entries = [(int(rng.integers(3, 40000)), len(prompts[s]) + i, s, True) for s in range(4)]
            ours, theirs = _decode(ctx, entries)[0], peer.decode_batch(entries)
            assert (ours.view(np.uint32) == theirs.view(np.uint32)).all(), ("step", i, np.abs(ours - theirs).max())
    finally:
        peer.close()
        ctx.close()
        model.close()
