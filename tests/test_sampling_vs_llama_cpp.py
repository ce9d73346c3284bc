"""Every sampler side by side with llama.cpp's own (llama-cpp-python's shared library).

Random rows go through our sampler and through llama.cpp's on the same candidates; the results
must agree: size, ids in order, logits, probabilities, selected index and sorted flag. Seeded
samplers must draw the same tokens step after step. Most rows hold no ties; the tied rows at the
end hold a few distinct values many times over, and every sampler that sorts must keep the same
ids in the same order as llama.cpp's (GCC-built) std::sort, std::partial_sort and bucket sort.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _llama import import_peer

import_peer()

from gguflm.bench.sampling import LlamaCppSamplers  # noqa: E402
from gguflm.sampling import SamplingParams, common_sampler  # noqa: E402
from gguflm.samplers import (  # noqa: E402
    DRY,
    XTC,
    Dist,
    Greedy,
    LogitBias,
    MinP,
    Mirostat,
    MirostatV2,
    Penalties,
    Temp,
    TempExt,
    TokenDataArray,
    TopK,
    TopNSigma,
    TopP,
    Typical,
)

REF = LlamaCppSamplers()
SETTINGS = settings(max_examples=40, deadline=None)

sizes = st.sampled_from([1, 2, 3, 7, 40, 300, 1500, 5000])
seeds = st.integers(0, 2**32 - 2)
unit = st.floats(0.0, 1.0, width=32)
min_keeps = st.integers(0, 5)


def row(n: int, seed: int, scale: float = 3.0) -> np.ndarray:
    """Normal logits without ties (llama.cpp leaves the order of equal logits unspecified)."""
    logits = (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)
    while True:
        _, first = np.unique(logits, return_index=True)
        if len(first) == n:
            return logits
        repeats = np.setdiff1d(np.arange(n), first)
        logits[repeats] = np.nextafter(logits[repeats], np.float32(np.inf))


def load(logits: np.ndarray, with_p: bool):
    """The same candidates on both sides (p random when ``with_p``)."""
    p = np.random.default_rng(len(logits)).random(len(logits)).astype(np.float32) if with_p \
        else None
    theirs = REF.candidates(len(logits))
    theirs.load(logits, p)
    ours = TokenDataArray(np.arange(len(logits)), logits, p)
    return ours, theirs


def assert_same(ours: TokenDataArray, theirs) -> None:
    view = theirs.view()
    assert ours.size == len(view)
    np.testing.assert_array_equal(ours.ids, view["id"])
    np.testing.assert_allclose(ours.logits, view["logit"], rtol=1e-6, atol=0)
    np.testing.assert_allclose(ours.p, view["p"], rtol=2e-6, atol=1e-9)
    assert ours.selected == theirs.selected
    assert ours.sorted == theirs.is_sorted


def apply_both(pairs, logits: np.ndarray, with_p: bool = False):
    """Apply (ours, theirs) sampler pairs in order to one row; compare after each."""
    ours, theirs = load(logits, with_p)
    for mine, reference in pairs:
        mine.apply(ours)
        theirs.apply(reference)
        assert_same(ours, theirs)
    return ours, theirs


@SETTINGS
@given(n=sizes, seed=seeds, presorted=st.booleans())
def test_greedy(n, seed, presorted):
    prefix = [(TopK(n), REF.init("top_k", n))] if presorted else []
    apply_both([*prefix, (Greedy(), REF.init("greedy"))], row(n, seed))


@SETTINGS
@given(n=sizes, seed=seeds, k=st.integers(-1, 6000), with_p=st.booleans())
def test_top_k(n, seed, k, with_p):
    apply_both([(TopK(k), REF.init("top_k", k))], row(n, seed), with_p)


@SETTINGS
@given(n=sizes, seed=seeds, p=unit, min_keep=min_keeps, k=st.integers(0, 50))
def test_top_p(n, seed, p, min_keep, k):
    pairs = [(TopK(k), REF.init("top_k", k))] if k else []
    apply_both([*pairs, (TopP(p, min_keep), REF.init("top_p", p, min_keep))], row(n, seed))


@SETTINGS
@given(n=sizes, seed=seeds, p=st.floats(0.0, 1.125, width=32), min_keep=min_keeps,
       k=st.integers(0, 50))
def test_min_p(n, seed, p, min_keep, k):
    pairs = [(TopK(k), REF.init("top_k", k))] if k else []
    apply_both([*pairs, (MinP(p, min_keep), REF.init("min_p", p, min_keep))], row(n, seed))


@pytest.mark.parametrize("n", [1, 2, 300])
def test_min_p_on_a_row_of_minus_infinity(n):
    """llama.cpp's max starts at -FLT_MAX: nothing reaches it, and min-p falls back to sorting."""
    apply_both([(MinP(0.25, 1), REF.init("min_p", 0.25, 1))], np.full(n, -np.inf, np.float32))


@SETTINGS
@given(n=sizes, seed=seeds, p=unit, min_keep=min_keeps, k=st.sampled_from([0, 200]))
def test_typical(n, seed, p, min_keep, k):
    prefix = [(TopK(k), REF.init("top_k", k))] if k else []
    apply_both([*prefix, (Typical(p, min_keep), REF.init("typical", p, min_keep))],
               row(n, seed))


@SETTINGS
@given(n=sizes, seed=seeds, t=st.floats(-0.5, 2.0, width=32))
def test_temp(n, seed, t):
    apply_both([(Temp(t), REF.init("temp", t)), (Dist(seed), REF.init("dist", seed))],
               row(n, seed))


@SETTINGS
@given(n=sizes, seed=seeds, t=st.floats(-0.5, 2.0, width=32), delta=st.floats(0.0, 1.0, width=32),
       exponent=st.floats(0.25, 2.0, width=32))
def test_temp_ext(n, seed, t, delta, exponent):
    apply_both([(TopK(100), REF.init("top_k", 100)),
                (TempExt(t, delta, exponent), REF.init("temp_ext", t, delta, exponent))],
               row(n, seed))


@SETTINGS
@given(n=sizes, seed=seeds, sigma=st.floats(-1.0, 3.0, width=32))
def test_top_n_sigma(n, seed, sigma):
    apply_both([(TopNSigma(sigma), REF.init("top_n_sigma", sigma))], row(n, seed), with_p=True)


@SETTINGS
@given(n=sizes, seed=seeds, p=unit, t=st.floats(0.0, 0.625, width=32), min_keep=min_keeps)
def test_xtc_over_steps(n, seed, p, t, min_keep):
    ours, theirs = XTC(p, t, min_keep, seed), REF.init("xtc", p, t, min_keep, seed)
    for step in range(4):
        apply_both([(TopK(30), REF.init("top_k", 30)), (ours, theirs)], row(n, seed + step, 1.0))


@SETTINGS
@given(n=sizes, seed=seeds, steps=st.integers(1, 6))
def test_dist_draws_the_same_tokens(n, seed, steps):
    ours, theirs = Dist(seed), REF.init("dist", seed)
    for step in range(steps):
        apply_both([(ours, theirs)], row(n, seed + step))


@SETTINGS
@given(n=st.sampled_from([2, 40, 1500]), seed=seeds, tau=st.floats(0.5, 8.0, width=32),
       eta=st.floats(0.0, 0.5, width=32), m=st.integers(1, 120))
def test_mirostat_over_steps(n, seed, tau, eta, m):
    ours, theirs = Mirostat(n, seed, tau, eta, m), REF.init("mirostat", n, seed, tau, eta, m)
    for step in range(4):
        apply_both([(ours, theirs)], row(n, seed + step))


@SETTINGS
@given(n=st.sampled_from([1, 2, 40, 1500]), seed=seeds, tau=st.floats(0.5, 8.0, width=32),
       eta=st.floats(0.0, 0.5, width=32))
def test_mirostat_v2_over_steps(n, seed, tau, eta):
    ours, theirs = MirostatV2(seed, tau, eta), REF.init("mirostat_v2", seed, tau, eta)
    for step in range(4):
        apply_both([(ours, theirs)], row(n, seed + step))


@SETTINGS
@given(n=sizes, seed=seeds, last_n=st.integers(0, 24), repeat=st.floats(0.5, 2.0, width=32),
       freq=st.floats(-1.0, 1.0, width=32), present=st.floats(-1.0, 1.0, width=32),
       history=st.lists(st.integers(0, 60), max_size=40), sort_first=st.booleans())
def test_penalties(n, seed, last_n, repeat, freq, present, history, sort_first):
    ours, theirs = Penalties(last_n, repeat, freq, present), \
        REF.init("penalties", n, last_n, repeat, freq, present)
    for token in history:
        ours.accept(token)
        REF.lib.llama_sampler_accept(theirs, token)
    prefix = [(TopK(n), REF.init("top_k", n))] if sort_first else []
    apply_both([*prefix, (ours, theirs)], row(n, seed))


@SETTINGS
@given(n=st.sampled_from([5, 40, 300]), seed=seeds, multiplier=st.floats(0.0, 2.0, width=32),
       base=st.floats(0.875, 3.0, width=32), allowed=st.integers(0, 4),
       last_n=st.integers(-2, 40), history=st.lists(st.integers(0, 4), max_size=60))
def test_dry(n, seed, multiplier, base, allowed, last_n, history):
    ours, theirs = DRY(None, multiplier, base, allowed, last_n), \
        REF.dry(multiplier, base, allowed, last_n)
    for token in history:
        ours.accept(token)
        REF.lib.llama_sampler_accept(theirs, token)
    apply_both([(ours, theirs)], row(n, seed))


@SETTINGS
@given(n=sizes, seed=seeds,
       biases=st.lists(st.tuples(st.integers(-3, 6000), st.floats(-5.0, 5.0, width=32)),
                       max_size=8),
       k=st.integers(0, 50))
def test_logit_bias(n, seed, biases, k):
    prefix = [(TopK(k), REF.init("top_k", k))] if k else []
    apply_both([*prefix, (LogitBias(n, biases), REF.logit_bias(n, biases))], row(n, seed))


@settings(max_examples=10, deadline=None)
@given(seed=seeds, temp=st.sampled_from([0.0, 0.8, 1.5]), repeat=st.sampled_from([1.0, 1.3]),
       top_n_sigma=st.sampled_from([-1.0, 2.0]), xtc=st.sampled_from([0.0, 0.5]),
       tied=st.booleans())
def test_common_chain_generates_the_same_tokens(seed, temp, repeat, top_n_sigma, xtc, tied):
    """llama.cpp's default chain, 12 steps with accept: the same token at every step (on tied
    rows too: logits in steps of 0.5, each value hundreds of times)."""
    n = 5000
    params = SamplingParams(seed=seed, temp=temp, penalty_repeat=repeat, top_n_sigma=top_n_sigma,
                            xtc_probability=xtc, dry_multiplier=0.8, dry_sequence_breakers=())
    ours, theirs = common_sampler(params, n_vocab=n), REF.common_chain(params, n)
    candidates = REF.candidates(n)
    for step in range(12):
        rng = np.random.default_rng(seed + step)
        logits = (rng.integers(-8, 8, n) * 0.5).astype(np.float32) if tied \
            else row(n, seed + step, 2.0)

        class Ctx:
            @staticmethod
            def get_logits_ith(idx):
                return logits

        token = ours.sample(Ctx(), -1)
        candidates.load(logits)
        candidates.apply(theirs)
        expected = candidates.selected_id()
        REF.lib.llama_sampler_accept(theirs, expected)
        assert token == expected, f"step {step}"


# --- tied rows ------------------------------------------------------------------------------
# Sizes on both sides of libstdc++'s insertion-sort threshold (16), of llama.cpp's in-place
# partial sort limit (128) and of top-p's 1024; k on both sides of 128, where llama.cpp goes from
# std::partial_sort to its bucket sort (whose buckets std::sort in turn).

TIED_SETTINGS = settings(max_examples=25, deadline=None)
tied_sizes = st.sampled_from([16, 17, 128, 129, 1000, 1025, 3000])
ks = st.one_of(st.integers(1, 128), st.integers(129, 3000))
# logits beyond ~3.4e8 and +inf fall into llama.cpp's lowest bucket (its int conversion)
extremes = st.sampled_from([0.0, -0.0, -np.inf, np.inf, 1e9, -1e9])


@st.composite
def tied_rows(draw, values=st.floats(-14.0, 14.0, width=32)):
    """A row of a few distinct values (2 to 6), each repeated many times."""
    n = draw(tied_sizes)
    pool = np.array(draw(st.lists(values, min_size=2, max_size=6)), dtype=np.float32)
    picks = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(0, len(pool), n)
    return pool[picks]


def top_k_prefix(k: int) -> list:
    """(ours, theirs) top-k pairs to sort the row first (none for k = 0)."""
    return [(TopK(k), REF.init("top_k", k))] if k else []


@TIED_SETTINGS
@given(logits=tied_rows(st.one_of(st.floats(-14.0, 14.0, width=32), extremes)), k=ks,
       with_p=st.booleans())
def test_top_k_on_tied_rows(logits, k, with_p):
    apply_both([(TopK(k), REF.init("top_k", k))], logits, with_p)


@TIED_SETTINGS
@given(logits=tied_rows(), p=unit, min_keep=st.sampled_from([0, 1, 5, 300]),
       k=st.sampled_from([0, 0, 40, 200]))
def test_top_p_on_tied_rows(logits, p, min_keep, k):
    """Unsorted rows over 1024 take llama.cpp's two steps (best 256, then all)."""
    apply_both([*top_k_prefix(k), (TopP(p, min_keep), REF.init("top_p", p, min_keep))], logits)


@TIED_SETTINGS
@given(logits=tied_rows(), p=st.floats(0.0, 1.0, width=32),
       min_keep=st.sampled_from([0, 1, 5, 3000]), k=st.sampled_from([0, 0, 40, 200]))
def test_min_p_on_tied_rows(logits, p, min_keep, k):
    """A large min_keep makes unsorted candidates take llama.cpp's sorting fallback."""
    apply_both([*top_k_prefix(k), (MinP(p, min_keep), REF.init("min_p", p, min_keep))], logits)


@TIED_SETTINGS
@given(logits=tied_rows(), p=unit, min_keep=min_keeps, k=st.sampled_from([0, 40, 200]))
def test_typical_on_tied_rows(logits, p, min_keep, k):
    """Equal probabilities give equal shifted scores: typical's std::sort of indices ties."""
    apply_both([*top_k_prefix(k), (Typical(p, min_keep), REF.init("typical", p, min_keep))],
               logits)


def softmax_sorting_samplers(n: int, seed: int) -> list:
    """(ours, theirs) pairs of the samplers that sort through llama.cpp's softmax: temp-ext, xtc
    (set to always run), mirostat, mirostat v2."""
    return [
        (TempExt(0.8, 0.5, 1.0), REF.init("temp_ext", 0.8, 0.5, 1.0)),
        (XTC(1.0, 0.01, 1, seed), REF.init("xtc", 1.0, 0.01, 1, seed)),
        (Mirostat(n, seed, 5.0, 0.1, 100), REF.init("mirostat", n, seed, 5.0, 0.1, 100)),
        (MirostatV2(seed, 5.0, 0.1), REF.init("mirostat_v2", seed, 5.0, 0.1)),
    ]


@TIED_SETTINGS
@given(logits=tied_rows(), seed=seeds, k=st.sampled_from([0, 40, 200]),
       penalise=st.booleans())
def test_softmax_sorting_samplers_on_tied_rows(logits, seed, k, penalise):
    """Each sorts all candidates first; after top-k and penalties they come half sorted
    (penalties clear the flag)."""
    prefix = top_k_prefix(k)
    if penalise:
        ours_pen, theirs_pen = Penalties(8, 1.3, 0.0, 0.0), REF.init("penalties", len(logits), 8,
                                                                     1.3, 0.0, 0.0)
        for token in (0, 1, 2, 3):
            ours_pen.accept(token)
            REF.lib.llama_sampler_accept(theirs_pen, token)
        prefix.append((ours_pen, theirs_pen))
    for pair in softmax_sorting_samplers(len(logits), seed):
        apply_both([*prefix, pair], logits)


@st.composite
def narrow_rows(draw):
    """Long rows squeezed into a few of llama.cpp's buckets (hundreds of candidates in each),
    with distinct logits (the radix shortcut) or rounded to a few digits (ties among them)."""
    n = draw(st.sampled_from([3000, 20000]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    logits = rng.standard_normal(n) * draw(st.sampled_from([0.05, 0.3]))
    digits = draw(st.sampled_from([None, 3, 4]))
    return (logits if digits is None else np.round(logits, digits)).astype(np.float32)


@settings(max_examples=12, deadline=None)
@given(logits=narrow_rows(), k=st.integers(129, 2999), p=unit, tie_at_cut=st.booleans())
def test_bucket_sorts_on_narrow_rows(logits, k, p, tie_at_cut):
    """top-k, top-p, min-p's sorting fallback and typical on the same row; with ``tie_at_cut``
    the k-th best logit is also the next four's, so that top-k's partial sort decides which of
    the five stays."""
    n = len(logits)
    if tie_at_cut:
        best_first = np.argsort(-logits, kind="stable")
        logits[best_first[k - 1:k + 4]] = logits[best_first[k - 1]]
    apply_both([(TopK(k), REF.init("top_k", k))], logits)
    apply_both([(TopP(p, 1), REF.init("top_p", p, 1))], logits)
    apply_both([(MinP(0.05, n), REF.init("min_p", 0.05, n))], logits)
    apply_both([(Typical(p, 1), REF.init("typical", p, 1))], logits)
