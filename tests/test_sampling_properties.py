"""Properties every sampler must keep, on random rows (hypothesis).

* probabilities after a softmax or a draw sum to 1;
* top-k keeps exactly min(k, n), best first, every kept logit >= every removed one (which of
  tied logits stay, and their order, is llama.cpp's: test_sampling_vs_llama_cpp.py checks it);
* top-p keeps the shortest best-first prefix whose probability reaches p;
* greedy is argmax; a seeded dist is deterministic and follows the distribution; an unseeded
  one draws a fresh seed and runs on it;
* clone() continues exactly as the original would, for every stateful sampler and for chains;
* a chain of every sampler only ever returns a token that survived every step.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gguflm.sampling import SamplerChain
from gguflm.samplers import (
    DRY,
    LLAMA_DEFAULT_SEED,
    XTC,
    Dist,
    Greedy,
    LogitBias,
    MinP,
    Mirostat,
    MirostatV2,
    Penalties,
    Sampler,
    Temp,
    TempExt,
    TokenDataArray,
    TopK,
    TopNSigma,
    TopP,
    Typical,
)

SETTINGS = settings(max_examples=60, deadline=None)

rows = hnp.arrays(np.float32, st.integers(1, 600), elements=st.floats(-20, 20, width=32))
tied_rows = hnp.arrays(np.float32, st.integers(1, 300),
                       elements=st.sampled_from([-1.0, 0.0, 0.5, 2.0]))
seeds = st.integers(0, 2**32 - 2)


def candidates(logits: np.ndarray) -> TokenDataArray:
    return TokenDataArray.from_logits(logits)


@SETTINGS
@given(logits=rows, seed=seeds, k=st.integers(0, 50), p=st.floats(0.1, 1.0))
def test_probabilities_sum_to_one_after_the_draw(logits, seed, k, p):
    cur_p = candidates(logits)
    for sampler in (TopK(k), TopP(p), Temp(0.7), Dist(seed)):
        sampler.apply(cur_p)
    assert 0 <= cur_p.selected < cur_p.size
    np.testing.assert_allclose(cur_p.p.sum(dtype=np.float64), 1.0, atol=1e-5)
    cur_p.softmax(do_sort=True)
    np.testing.assert_allclose(cur_p.p.sum(dtype=np.float64), 1.0, atol=1e-5)
    assert np.all(np.diff(cur_p.logits) <= 0)


@SETTINGS
@given(logits=st.one_of(rows, tied_rows), k=st.integers(-3, 700))
def test_top_k_keeps_exactly_the_k_best_best_first(logits, k):
    cur_p = candidates(logits)
    TopK(k).apply(cur_p)
    n = len(logits)
    if k <= 0:
        assert cur_p.size == n and not cur_p.sorted
        return
    assert cur_p.size == min(k, n) and cur_p.sorted
    assert len(np.unique(cur_p.ids)) == cur_p.size
    np.testing.assert_array_equal(cur_p.logits, logits[cur_p.ids])
    np.testing.assert_array_equal(cur_p.logits, np.sort(logits)[::-1][:cur_p.size])


@SETTINGS
@given(logits=rows, p=st.floats(0.0, 1.0, width=32), min_keep=st.integers(0, 4))
def test_top_p_keeps_the_shortest_prefix_reaching_p(logits, p, min_keep):
    cur_p = candidates(logits)
    TopP(p, min_keep).apply(cur_p)
    if p >= 1.0:
        assert cur_p.size == len(logits)
        return
    kept = cur_p.p
    cumulative = np.cumsum(kept, dtype=np.float32)
    assert cur_p.sorted and np.all(np.diff(cur_p.logits) <= 0)
    full = np.exp(logits.astype(np.float64) - logits.max())
    full /= full.sum()
    # llama.cpp's softmax sums in float: the error grows with the row's length
    np.testing.assert_allclose(np.sort(kept)[::-1], np.sort(full)[::-1][:cur_p.size],
                               rtol=1e-6 + 6e-8 * len(logits), atol=1e-7)
    if cur_p.size < len(logits):  # reached p with enough candidates ...
        assert cumulative[-1] >= np.float32(p) and cur_p.size >= min_keep
    if cur_p.size > max(min_keep, 1):  # ... and one fewer would not have
        assert cumulative[-2] < np.float32(p)


@SETTINGS
@given(logits=rows)
def test_greedy_is_argmax(logits):
    cur_p = candidates(logits)
    Greedy().apply(cur_p)
    assert cur_p.selected_id == int(np.argmax(logits))


@settings(max_examples=20, deadline=None)
@given(logits=rows, seed=seeds)
def test_seeded_dist_is_deterministic_and_reset_restarts_it(logits, seed):
    def draws(sampler: Dist) -> list[int]:
        out = []
        for _ in range(8):
            cur_p = candidates(logits)
            sampler.apply(cur_p)
            out.append(cur_p.selected_id)
        return out

    first = Dist(seed)
    sequence = draws(first)
    assert draws(Dist(seed)) == sequence
    first.reset()
    assert draws(first) == sequence


def test_dist_follows_the_distribution():
    """8,000 seeded draws over 5 tokens: every frequency within 4 sigma of its probability."""
    logits = np.log(np.array([0.05, 0.1, 0.15, 0.3, 0.4], dtype=np.float32))
    sampler, counts = Dist(2024), np.zeros(5)
    for _ in range(8000):
        cur_p = candidates(logits)
        sampler.apply(cur_p)
        counts[cur_p.selected_id] += 1
    expected = np.exp(logits) * 8000
    assert np.all(np.abs(counts - expected) < 4 * np.sqrt(expected))


def test_random_seed_is_drawn_when_none_is_given():
    """None, -1 and LLAMA_DEFAULT_SEED each draw a fresh 32-bit seed, the generator runs on it,
    and reset() draws another (llama.cpp's get_rng_seed). Five independent draws from 2**32
    values coincide with probability below 3e-9."""
    unseeded = [Dist(None), Dist(-1), Dist(LLAMA_DEFAULT_SEED), Dist(None)]
    assert all(sampler.seed == LLAMA_DEFAULT_SEED for sampler in unseeded)
    drawn = [sampler.seed_cur for sampler in unseeded]
    assert all(0 <= seed < 2**32 for seed in drawn)
    unseeded[0].reset()
    assert len({*drawn, unseeded[0].seed_cur}) == 5
    flat = np.zeros(1000, dtype=np.float32)
    for sampler in unseeded:
        twin = Dist(sampler.seed_cur)
        for _ in range(3):
            ours, theirs = candidates(flat), candidates(flat)
            sampler.apply(ours)
            twin.apply(theirs)
            assert ours.selected == theirs.selected


def stateful_samplers(seed: int, n: int) -> list[Sampler]:
    return [
        Dist(seed),
        XTC(0.7, 0.05, 1, seed),
        Mirostat(n, seed, 3.0, 0.2, 20),
        MirostatV2(seed, 3.0, 0.2),
        Penalties(6, 1.3, 0.2, 0.1),
        DRY(None, 0.8, 1.75, 2, 30, [[3], [5, 6]]),
        SamplerChain([Penalties(8, 1.2, 0.0, 0.0), TopK(20), XTC(0.5, 0.1, 1, seed),
                      TempExt(0.9, 0.3, 1.0), Dist(seed)]),
    ]


@settings(max_examples=15, deadline=None)
@given(seed=seeds, warmup=st.integers(0, 6))
def test_clone_continues_identically(seed, warmup):
    n = 64
    rng = np.random.default_rng(seed)
    logit_rows = [rng.standard_normal(n).astype(np.float32) * 2 for _ in range(warmup + 6)]
    history = rng.integers(0, 8, warmup + 6)

    def step(sampler: Sampler, i: int) -> tuple:
        cur_p = candidates(logit_rows[i])
        sampler.apply(cur_p)
        sampler.accept(int(history[i]))
        return cur_p.size, tuple(cur_p.ids), tuple(np.round(cur_p.p, 6)), cur_p.selected

    for original in stateful_samplers(seed, n):
        for i in range(warmup):
            step(original, i)
        twin = original.clone()
        assert type(twin) is type(original) and twin is not original
        for i in range(warmup, warmup + 6):
            assert step(twin, i) == step(original, i), original.name


class Survivors(Sampler):
    """Records which ids are still candidates at its place in a chain."""

    name = "survivors"

    def __init__(self, log: list) -> None:
        self.log = log

    def apply(self, cur_p: TokenDataArray) -> None:
        self.log.append(set(cur_p.ids.tolist()))


@settings(max_examples=40, deadline=None)
@given(logits=hnp.arrays(np.float32, st.integers(2, 400), elements=st.floats(-8, 8, width=32)),
       seed=seeds, banned=st.lists(st.integers(0, 399), max_size=20),
       history=st.lists(st.integers(0, 399), max_size=30), k=st.integers(0, 60),
       top_p=st.floats(0.05, 1.0), min_p=st.floats(0.0, 0.5), temp=st.floats(-0.5, 2.0),
       typical=st.floats(0.2, 1.0), sigma=st.floats(-1.0, 3.0), xtc=st.floats(0.0, 1.0))
def test_chain_of_every_sampler_never_returns_a_removed_token(
        logits, seed, banned, history, k, top_p, min_p, temp, typical, sigma, xtc):
    n = len(logits)
    banned = sorted({b for b in banned if b < n})
    if len(banned) == n:
        banned = banned[1:]
    log: list[set] = []
    stages = [LogitBias(n, [(b, -np.inf) for b in banned]), Penalties(16, 1.4, 0.1, 0.1),
              DRY(None, 0.8, 1.75, 2, 32, [[0]]), TopNSigma(sigma), TopK(k), Typical(typical),
              TopP(top_p), MinP(min_p), XTC(xtc, 0.1, 1, seed), TempExt(temp, 0.2, 1.0)]
    chain = SamplerChain()
    for stage in stages:
        chain.add(stage)
        chain.add(Survivors(log))
    chain.add(Dist(seed))
    for token in history:
        chain.accept(token)

    class Ctx:
        @staticmethod
        def get_logits_ith(idx):
            return logits

    for _ in range(3):
        log.clear()
        token = chain.sample(Ctx(), -1)
        assert token not in banned or all(b in banned for b in range(n))
        assert all(token in survivors for survivors in log)
        assert all(later <= earlier for earlier, later in zip(log, log[1:]))


@pytest.mark.parametrize("sampler", [
    Greedy(), Dist(1), TopK(3), TopP(0.5), MinP(0.1), Typical(0.5), Temp(0.5), Temp(0.0),
    TempExt(0.5, 0.2, 1.0), XTC(1.0, 0.1, 1, 1), TopNSigma(1.0), Mirostat(10, 1, 5.0, 0.1, 100),
    MirostatV2(1, 5.0, 0.1), Penalties(4, 1.5, 0.1, 0.1), DRY(None, 1.0, 1.5, 1, 8, [[2]]),
    LogitBias(10, {1: 2.0}),
], ids=lambda s: s.name)
def test_every_sampler_passes_an_empty_array_through(sampler):
    sampler.accept(1)
    cur_p = TokenDataArray(np.zeros(0, np.int32), np.zeros(0, np.float32))
    sampler.apply(cur_p)
    assert cur_p.size == 0 and cur_p.selected == -1
