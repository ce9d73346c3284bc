"""llama.cpp's ``tests/test-sampling.cpp``, ported: same inputs, same expected probabilities, ids.

Every case builds candidates as that file's ``sampler_tester`` does (logit = logf(p), p given, ids
0..n-1, unsorted), applies the sampler (and, where the C++ test does, ``dist(0)``), then compares
the surviving probabilities with llama.cpp's expectations within 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

from gguflm.samplers import (
    DRY,
    XTC,
    Dist,
    MinP,
    Penalties,
    Temp,
    TempExt,
    TokenDataArray,
    TopK,
    TopNSigma,
    TopP,
    Typical,
)


def candidates(probs: list[float]) -> TokenDataArray:
    p = np.array(probs, dtype=np.float32)
    with np.errstate(divide="ignore"):
        logits = np.log(p)
    return TokenDataArray(np.arange(len(p)), logits, p)


def check(cur_p: TokenDataArray, expected: list[float]) -> None:
    assert cur_p.size == len(expected)
    np.testing.assert_allclose(cur_p.p, np.array(expected, dtype=np.float32), rtol=0, atol=1e-5)


def run(probs, expected, *samplers) -> TokenDataArray:
    cur_p = candidates(probs)
    for sampler in samplers:
        sampler.apply(cur_p)
    check(cur_p, expected)
    return cur_p


P4 = [0.1, 0.2, 0.3, 0.4]


def test_dist_draws_for_a_single_candidate_too():
    singleton, control = Dist(4242), Dist(4242)
    one, two = candidates([1.0]), TokenDataArray([0, 1], [0.0, 0.0])
    singleton.apply(one)
    control.apply(two)
    assert one.selected == 0 and one.p[0] == 1.0
    flat = np.zeros(256, dtype=np.float32)
    for _ in range(4):
        a, b = TokenDataArray.from_logits(flat), TokenDataArray.from_logits(flat)
        control.apply(a)
        singleton.apply(b)
        assert a.selected_id == b.selected_id


@pytest.mark.parametrize("temp, expected", [(1.0, P4), (0.0, [0, 0, 0, 1])])
def test_temp(temp, expected):
    run(P4, expected, Temp(temp), Dist(0))


@pytest.mark.parametrize("temp, expected", [(1.0, P4), (0.0, [0, 0, 0, 1])])
def test_temp_ext(temp, expected):
    run(P4, expected, TempExt(temp, 0.0, 1.0), Dist(0))


@pytest.mark.parametrize("k, expected", [
    (1, [1.0]),
    (3, [0.44444, 0.33333, 0.22222]),
    (4, [0.4, 0.3, 0.2, 0.1]),
    (0, P4),
])
def test_top_k(k, expected):
    run(P4, expected, TopK(k), Dist(0))


@pytest.mark.parametrize("p, expected", [
    (0.0, [1.0]),
    (0.7, [0.571429, 0.428571]),
    (0.8, [0.44444, 0.33333, 0.22222]),
    (1.0, P4),
])
def test_top_p(p, expected):
    run(P4, expected, TopP(p, 0), Dist(0))


@pytest.mark.parametrize("p, expected", [
    (0.00, [0.1, 0.2, 0.3, 0.4]),
    (0.24, [0.1, 0.2, 0.3, 0.4]),
    (0.26, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
    (0.49, [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
    (0.51, [0.3 / 0.7, 0.4 / 0.7]),
    (0.74, [0.3 / 0.7, 0.4 / 0.7]),
    (0.76, [1.0]),
    (1.00, [1.0]),
    (1.05, [1.0]),
])
def test_min_p(p, expected):
    run(P4, expected, MinP(p, 0), Dist(0))


@pytest.mark.parametrize("threshold, expected", [
    (0.09, [0.1]),
    (0.19, [0.2, 0.1]),
    (0.29, [0.3, 0.2, 0.1]),
    (0.39, [0.4, 0.3, 0.2, 0.1]),  # "should not"
])
def test_xtc(threshold, expected):
    run([0.4, 0.3, 0.2, 0.1], expected, XTC(0.99, threshold, 0, 0))


@pytest.mark.parametrize("probs, expected", [
    ([0.97, 0.01, 0.01, 0.01], [0.97]),
    ([0.4, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2]),
])
def test_typical(probs, expected):
    run(probs, expected, Typical(0.5, 0))


@pytest.mark.parametrize("last, expected, repeat, freq, present", [
    ([0], [0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
    ([0, 1, 2], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
    ([0, 1, 2, 0, 0], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
    ([0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
    ([0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
    ([0, 1, 2, 0, 0], [0.000000, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0),
])
def test_penalties(last, expected, repeat, freq, present):
    penalties = Penalties(len(last), repeat, freq, present)
    for token in last:
        penalties.accept(token)
    run([0.2] * 5, expected, penalties, Dist(0))


@pytest.mark.parametrize("probs, last, expected, multiplier, base, allowed, last_n, breakers", [
    ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, []),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, [[3]]),
    ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818],
     2.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, []),
])
def test_dry(probs, last, expected, multiplier, base, allowed, last_n, breakers):
    dry = DRY(None, multiplier, base, allowed, last_n, breakers)
    for token in last:
        dry.accept(token)
    run(probs, expected, dry, Dist(0))


@pytest.mark.parametrize("n, expected", [
    (1.0, [0.0, 0.0, 0.428571, 0.571429]),
    (0.0, P4),  # no-op rather than greedy since llama.cpp PR #13345
    (3.0, P4),
])
def test_top_n_sigma(n, expected):
    run(P4, expected, TopNSigma(n), Dist(0))


def _f32(x) -> np.float32:
    return np.float32(x)


def check_queue_step(cur_p, size, expected_size, first_id, last_id):
    assert size == expected_size
    assert not cur_p.sorted or cur_p.ids[0] == first_id
    assert not cur_p.sorted or cur_p.ids[expected_size - 1] == last_id


@pytest.mark.parametrize("sequence, top_k, top_p, min_p", [
    ("k", 10000, 1.0, 1.0),
    ("k", 1, 1.0, 1.0),
    ("p", 10000, 1.0, 1.0),
    ("p", 10000, 0.0, 1.0),
    ("m", 10000, 1.0, 1.0),
    ("m", 10000, 1.0, 1e-12),
    ("k", 100, 1.0000, 1.0),
    ("p", 10000, 0.0003, 1.0),
    ("p", 10000, 0.8000, 1.0),
    ("m", 10000, 1.0000, float(_f32(9997.9) / _f32(9999.0))),
    ("m", 10000, 1.0000, 0.1),
    ("kp", 100, 0.8, 0.1),
    ("km", 100, 0.8, 0.1),
    ("pk", 100, 0.8, 0.1),
    ("pm", 100, 0.8, 0.1),
    ("mk", 100, 0.8, 0.1),
    ("mp", 100, 0.8, float(_f32(9997.9) / _f32(9999.0))),
    ("mp", 100, 0.8, 0.1),
    ("kpm", 100, 0.8, 0.1),
    ("kmp", 100, 0.8, 0.1),
    ("pkm", 100, 0.8, 0.1),
    ("pmk", 100, 0.8, 0.1),
    ("mkp", 100, 0.8, 0.1),
    ("mpk", 100, 0.8, 0.1),
])
def test_sampler_queue(sequence, top_k, top_p, min_p):
    """Candidate counts and first/last ids after each step on logits log(0..9999)."""
    n_vocab = 10000
    with np.errstate(divide="ignore"):
        cur_p = TokenDataArray.from_logits(np.log(np.arange(n_vocab, dtype=np.float32)))
    min_token_id, max_token_id = 0, n_vocab - 1
    make = {"k": lambda: TopK(top_k), "p": lambda: TopP(top_p, 1), "m": lambda: MinP(min_p, 1)}
    for step in sequence:
        make[step]().apply(cur_p)
        Dist(0).apply(cur_p)
        size = cur_p.size
        if step == "k":
            expected_size = min(size, top_k)
            min_token_id = max(min_token_id, n_vocab - top_k)
            assert size == expected_size
            assert cur_p.ids[0] == max_token_id
            assert cur_p.ids[expected_size - 1] == min_token_id
        elif step == "p":
            divisor = n_vocab * (n_vocab - 1) // 2 - min_token_id * (min_token_id - 1) // 2
            target = int(np.ceil(_f32(top_p) * _f32(divisor)))
            min_token_id, expected_size, cumsum = n_vocab, 0, 0
            while True:  # at least one token is always kept
                min_token_id -= 1
                expected_size += 1
                cumsum += min_token_id
                if cumsum >= target:
                    break
            if min_token_id == 1:  # token 0 has p == 0 and comes along
                min_token_id -= 1
                expected_size += 1
            check_queue_step(cur_p, size, expected_size, max_token_id, min_token_id)
        else:
            expected_size = int(np.ceil((_f32(1.0) - _f32(min_p)) * _f32(n_vocab)))
            expected_size = min(max(expected_size, 1), size)
            min_token_id = int(np.floor(_f32(min_p) * _f32(n_vocab)))
            min_token_id = min(max(min_token_id, 1, n_vocab - size), n_vocab - 1)
            check_queue_step(cur_p, size, expected_size, max_token_id, min_token_id)
