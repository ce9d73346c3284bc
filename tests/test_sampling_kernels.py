"""The C kernels behind the samplers, against oracles no one here wrote (numpy, the C++ standard).

* the Mersenne Twister stream against numpy's legacy-seeded MT19937 and the C++ standard's check
  value; the uniform draws against libstdc++'s generate_canonical formula on that stream;
* ordering against GCC's own std::sort and std::partial_sort (a small C++ oracle built with g++),
  ties included, for every SIMD variant, and on a quicksort killer that forces introsort's
  heapsort fallback;
* softmax against a float64 numpy softmax; token lookup and DRY's repeat counts against brute
  force.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gguflm import system
from gguflm._ext import sampling as kernels

SETTINGS = settings(max_examples=60, deadline=None)


# --- mt19937 --------------------------------------------------------------------------------

@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_mt19937_stream_matches_numpy_legacy_seeding(seed):
    expected = np.random.RandomState(seed)._bit_generator.random_raw(1300)  # crosses 2 twists
    np.testing.assert_array_equal(kernels.MT19937(seed).random_raw(1300), expected)


def test_mt19937_default_seed_check_value_from_the_cpp_standard():
    # [rand.predef]: the 10000th consecutive output of a default-constructed mt19937
    assert kernels.MT19937().random_raw(10000)[-1] == 4123659995


def test_uniform_draws_follow_generate_canonical():
    raw = np.random.RandomState(7)._bit_generator.random_raw(3).astype(np.float64)
    rng = kernels.MT19937(7)
    assert rng.uniform_double() == (raw[0] + raw[1] * 2.0**32) / 2.0**64
    assert rng.uniform_float() == np.float32(np.float32(raw[2]) / np.float32(2.0**32))
    assert rng.next_u32() == np.random.RandomState(7)._bit_generator.random_raw(4)[3]


def test_mt19937_copy_state_and_pickle_continue_the_stream():
    import pickle

    rng = kernels.MT19937(99)
    rng.random_raw(700)
    twin, restored = rng.copy(), pickle.loads(pickle.dumps(rng))
    expected = rng.random_raw(50)
    np.testing.assert_array_equal(twin.random_raw(50), expected)
    np.testing.assert_array_equal(restored.random_raw(50), expected)
    with pytest.raises(ValueError):
        rng.set_state((np.zeros(3, dtype=np.uint32), 0))


# --- ordering -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gcc_sorts(tmp_path_factory):
    """GCC's std::sort and std::partial_sort on llama.cpp's candidates (libstdcxx_sort_oracle.cpp),
    and McIlroy's adversary against that std::sort."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.fail("no C++ compiler (g++) to build the std::sort oracle")
    lib_path = tmp_path_factory.mktemp("oracle") / "libstdcxx_sort_oracle.so"
    subprocess.run([cxx, "-O1", "-shared", "-fPIC", str(Path(__file__).with_name(
        "libstdcxx_sort_oracle.cpp")), "-o", str(lib_path)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(lib_path))
    lib.oracle_sort.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.oracle_partial_sort.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    lib.oracle_killer_row.argtypes = [ctypes.c_int64, ctypes.c_void_p]
    return lib


def gcc_sort(lib, logits: np.ndarray) -> np.ndarray:
    ids = np.empty(len(logits), dtype=np.int32)
    lib.oracle_sort(logits.ctypes.data, len(logits), ids.ctypes.data)
    return ids


def gcc_partial_sort(lib, logits: np.ndarray, middle: int) -> np.ndarray:
    ids = np.empty(middle, dtype=np.int32)
    lib.oracle_partial_sort(logits.ctypes.data, len(logits), middle, ids.ctypes.data)
    return ids


@st.composite
def tied_rows(draw, sizes=st.integers(0, 300)):
    """Rows of a few distinct values (signed zeros and infinities among them) repeated many
    times, or of normal values rounded to a few digits (ties here and there), or not rounded
    (distinct: the radix shortcut)."""
    n = draw(sizes)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    digits = draw(st.sampled_from([None, None, 1, 2, 4, 8]))
    if digits is not None:
        return np.round(rng.standard_normal(n), digits).astype(np.float32)
    pool = draw(st.lists(st.one_of(st.floats(-12, 12, width=32),
                                   st.sampled_from([0.0, -0.0, np.inf, -np.inf])),
                         min_size=1, max_size=5))
    return np.array(pool, dtype=np.float32)[rng.integers(0, len(pool), n)]


# sizes on both sides of libstdc++'s insertion-sort threshold (16), of llama.cpp's in-place
# partial sort limit (128) and of the radix shortcut (256), and long rows for the scan
ordering_sizes = st.sampled_from([1, 2, 15, 16, 17, 33, 127, 128, 129, 255, 256, 1000, 3000])


@SETTINGS
@given(logits=tied_rows(ordering_sizes))
def test_sort_positions_is_gcc_std_sort(gcc_sorts, logits):
    n = len(logits)
    out = np.empty(n, dtype=np.int32)
    kernels.sort_positions(logits, out, np.empty(3 * n, dtype=np.uint64))
    np.testing.assert_array_equal(out, gcc_sort(gcc_sorts, logits))


@pytest.mark.parametrize("n, merge", [(1000, 2), (5000, 2), (5000, 4)])
def test_sort_positions_on_a_quicksort_killer_is_gcc_std_sort(gcc_sorts, n, merge):
    """McIlroy's adversary makes partitions lopsided until introsort runs out of depth and
    heapsorts what is left. Its values are distinct; merging each ``merge`` neighbouring values
    into one keeps these rows on the heapsort fallback with ties inside it."""
    logits = np.empty(n, dtype=np.float32)
    gcc_sorts.oracle_killer_row(n, logits.ctypes.data)
    logits = np.floor(logits / merge).astype(np.float32)
    out = np.empty(n, dtype=np.int32)
    kernels.sort_positions(logits, out, np.empty(3 * n, dtype=np.uint64))
    np.testing.assert_array_equal(out, gcc_sort(gcc_sorts, logits))


@SETTINGS
@given(logits=tied_rows(ordering_sizes), k=st.integers(1, 128),
       isa=st.sampled_from(kernels.available_isas()))
def test_partial_sort_positions_up_to_128_is_gcc_std_partial_sort(gcc_sorts, logits, k, isa):
    n = len(logits)
    k = min(k, n)
    out = np.empty(n, dtype=np.int32)
    written = kernels.partial_sort_positions(logits, k, out, np.empty(3 * n, np.uint64), isa)
    assert written == k
    np.testing.assert_array_equal(out[:k], gcc_partial_sort(gcc_sorts, logits, k))


@pytest.mark.parametrize("order", ["ascending", "descending"])
def test_partial_sort_positions_on_presorted_rows(gcc_sorts, order):
    logits = np.sort(np.random.default_rng(3).integers(-50, 50, 20000).astype(np.float32))
    logits = logits if order == "ascending" else logits[::-1].copy()
    out = np.empty(len(logits), dtype=np.int32)
    for isa in kernels.available_isas():
        kernels.partial_sort_positions(logits, 40, out, np.empty(3 * len(logits), np.uint64), isa)
        np.testing.assert_array_equal(out[:40], gcc_partial_sort(gcc_sorts, logits, 40))


# values with many ties, infinities, signed zeros and NaN
special_floats = st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, np.inf, -np.inf, np.nan])


@SETTINGS
@given(logits=hnp.arrays(np.float32, st.integers(1, 400), elements=special_floats),
       k=st.integers(-2, 420))
def test_partial_sort_positions_keeps_the_best_and_ranks_nan_last(logits, k):
    """Any k: distinct positions of the best logits, best first, NaN after everything (exact tie
    order is checked against GCC above and against llama.cpp in test_sampling_vs_llama_cpp.py).

    Above 128 the bucket sort files +inf in llama.cpp's lowest bucket, as llama.cpp's int
    conversion of it does: there +inf ranks below every finite logit here, above -inf."""
    n = len(logits)
    out = np.empty(n, dtype=np.int32)
    written = kernels.partial_sort_positions(logits, k, out, np.empty(3 * n, np.uint64))
    assert written == max(0, min(k, n))
    kept = out[:written]
    assert len(np.unique(kept)) == written and np.all((kept >= 0) & (kept < n))
    rank = logits.astype(np.float64)
    if written > 128:
        rank[np.isposinf(logits)] = -1e30
    nan = np.isnan(logits)
    rank[nan] = -np.inf
    expected = np.lexsort((-rank, nan))[:written]  # a best-first order of the same ranks
    np.testing.assert_array_equal(rank[kept], rank[expected])
    np.testing.assert_array_equal(nan[kept], nan[expected])


def test_unnamed_variant_is_the_one_switch():
    """Without an ISA named, the scan runs the one gguflm.system sets (and GGUFLM_ISA with it)."""
    logits = np.random.default_rng(9).standard_normal(3000).astype(np.float32)
    out = np.empty(40, np.int32)
    expected = np.argsort(-logits, kind="stable")[:40]
    for name in kernels.available_isas():
        with system.using(isa=name):
            assert kernels.dispatch()["isa"] == name
            kernels.partial_sort_positions(logits, 40, out, np.empty(3 * len(logits), np.uint64))
        np.testing.assert_array_equal(out, expected)


def test_kernels_refuse_short_buffers():
    logits = np.zeros(10, dtype=np.float32)
    with pytest.raises(ValueError):
        kernels.partial_sort_positions(logits, 5, np.empty(10, np.int32), np.empty(29, np.uint64))
    with pytest.raises(ValueError):
        kernels.sort_positions(logits, np.empty(4, np.int32), np.empty(20, np.uint64))
    with pytest.raises(ValueError):
        kernels.sort_positions(logits, np.empty(10, np.int32), np.empty(29, np.uint64))
    with pytest.raises(ValueError, match="unknown ISA"):
        kernels.partial_sort_positions(logits, 5, np.empty(10, np.int32), np.empty(30, np.uint64),
                                       "sse9")
    with pytest.raises(ValueError):
        kernels.take_prefix(np.zeros(3, np.int32), np.zeros(3, np.float32),
                            np.zeros(3, np.float32), np.array([5], np.int32),
                            np.empty(6, np.uint64))


# --- softmax and draws ----------------------------------------------------------------------

@SETTINGS
@given(logits=hnp.arrays(np.float32, st.integers(1, 500), elements=st.floats(-30, 30, width=32)))
def test_softmax_matches_float64_reference(logits):
    p = np.empty_like(logits)
    kernels.softmax(logits, p, False)
    exact = np.exp(logits.astype(np.float64) - logits.max())
    # llama.cpp sums in float, left to right: the error grows with the row's length
    np.testing.assert_allclose(p, exact / exact.sum(), rtol=1e-6 + 6e-8 * len(logits), atol=1e-7)


@SETTINGS
@given(logits=hnp.arrays(np.float32, st.integers(2, 200), elements=st.floats(-10, 10, width=32)),
       rnd=st.floats(0.0, 1.0, exclude_max=True))
def test_dist_select_picks_where_the_cumulative_probability_reaches_rnd(logits, rnd):
    p = np.empty_like(logits)
    chosen = kernels.dist_select(logits, p, False, rnd)
    weights = np.exp(logits.astype(np.float64) - logits.max())
    cumulative = np.cumsum(weights / weights.sum())
    # the draw lands in the chosen candidate's interval (up to float rounding at the edges)
    low = cumulative[chosen - 1] if chosen else 0.0
    assert low - 1e-6 <= rnd <= cumulative[chosen] + 1e-6
    np.testing.assert_allclose(p.sum(), 1.0, atol=1e-5)


def test_argmax_and_keep_max_only_take_the_first_maximum():
    logits = np.array([1.0, 3.0, -2.0, 3.0], dtype=np.float32)
    assert kernels.argmax(logits) == 1
    kernels.keep_max_only(logits)
    np.testing.assert_array_equal(logits, [-np.inf, 3.0, -np.inf, -np.inf])


# --- lookups --------------------------------------------------------------------------------

@SETTINGS
@given(ids=st.lists(st.integers(-5, 400), unique=True, max_size=300),
       tokens=st.lists(st.integers(-10, 500), unique=True, max_size=70))
def test_find_token_positions_matches_brute_force(ids, tokens):
    ids_a = np.array(ids, dtype=np.int32)
    tokens_a = np.array(sorted(tokens), dtype=np.int32)
    out = np.empty(len(tokens_a), dtype=np.int32)
    kernels.find_token_positions(ids_a, tokens_a, out)
    expected = [ids.index(t) if t in ids else -1 for t in tokens_a.tolist()]
    np.testing.assert_array_equal(out, expected)


def test_find_token_positions_wants_sorted_tokens():
    with pytest.raises(ValueError, match="sorted"):
        kernels.find_token_positions(np.arange(5, dtype=np.int32), np.array([3, 1], np.int32),
                                     np.empty(2, np.int32))


@SETTINGS
@given(recent=st.lists(st.integers(0, 3), max_size=80), rep_limit=st.integers(0, 90))
def test_dry_repeat_counts_match_brute_force(recent, rep_limit):
    """out[n-1-k]: how far the tokens from k on (most recent first) repeat the newest ones."""
    tokens = np.array(recent, dtype=np.int32)
    n = len(tokens)
    out = np.empty(n, dtype=np.int32)
    kernels.dry_repeat_counts(tokens, rep_limit, out)
    for k in range(1, n):
        run = 0
        while k + run < n and tokens[run] == tokens[k + run]:
            run += 1
        assert out[n - 1 - k] == min(run, rep_limit), k
    if n:
        assert out[n - 1] == 0
