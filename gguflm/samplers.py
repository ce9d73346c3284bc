"""llama.cpp's samplers, one class per ``llama_sampler_init_*``, over one candidates array.

A sampler has llama.cpp's small interface: ``name``, ``apply(cur_p)`` (filter, reorder, rescale or
select among the candidates in place), ``accept(token)`` (remember a chosen token), ``reset()``,
``clone()``, and ``sample(ctx, idx)``. :class:`gguflm.sampling.SamplerChain` runs several in order.

Semantics follow current llama.cpp (``src/llama-sampler.cpp``, checked side by side against the
build in llama-cpp-python 0.3.36): the same parameters in the same order, the same edge cases
(k <= 0, p >= 1, temperature <= 0, min_keep, removed candidates), the same float/double
arithmetic, and the same random stream — seeded samplers own a ``std::mt19937`` twin and draw
through libstdc++'s ``uniform_real_distribution``/``discrete_distribution`` formulas, so a seeded
chain picks the tokens llama.cpp (built with GCC) picks. Where we differ:

* NaN logits rank last (llama.cpp's ``a.logit > b.logit`` is no ordering with NaN, and GCC's
  sort may then read past the array); equal logits otherwise come out in llama.cpp's order, which
  our kernels reproduce move for move (GCC's ``std::sort``/``std::partial_sort`` and llama.cpp's
  bucket sort);
* an empty candidates array passes through every sampler unchanged and nothing is selected
  (llama.cpp asserts on it in softmax-based samplers);
* ``clone()`` copies all state, including the penalties' token counts and mirostat's ``mu`` and
  generator (llama.cpp's clones of those two start partly fresh);
* :class:`Penalties` takes no ``n_vocab`` (current llama.cpp's first argument, used only by its
  GPU "backend sampling").
"""

from __future__ import annotations

import operator
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from gguflm._ext import sampling as kernels
from gguflm.candidates import Sampler, TokenDataArray

__all__ = [
    "LLAMA_DEFAULT_SEED",
    "TokenDataArray",
    "Sampler",
    "Greedy",
    "Dist",
    "TopK",
    "TopP",
    "MinP",
    "Typical",
    "Temp",
    "TempExt",
    "XTC",
    "TopNSigma",
    "Mirostat",
    "MirostatV2",
    "Penalties",
    "DRY",
    "LogitBias",
    "Grammar",
]

#: llama.cpp's "pick a random seed" value (``LLAMA_DEFAULT_SEED``)
LLAMA_DEFAULT_SEED = 0xFFFFFFFF

_F32 = np.float32


def _c_float_math() -> np.errstate:
    """Float arithmetic as in C: overflow gives inf, 0/0 and inf-inf give NaN, silently."""
    return np.errstate(all="ignore")


def __getattr__(name: str) -> Any:
    # the grammar sampler lives with the grammar code (gguflm.grammar, on the interface of
    # gguflm.candidates); imported when first asked for
    if name == "Grammar":
        from gguflm.grammar.sampler import GrammarSampler

        return GrammarSampler
    raise AttributeError(f"module 'gguflm.samplers' has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------
# parameters


def _f32(value: Any, what: str) -> float:
    """A float parameter as llama.cpp stores it (a C float)."""
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{what} must be a number, got {value!r}")
    return float(_F32(value))


def _int(value: Any, what: str, minimum: int | None = None) -> int:
    try:
        result = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {value!r}") from None
    if minimum is not None and result < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {result}")
    if not -(2**63) <= result < 2**63:
        raise ValueError(f"{what} is out of range: {result}")
    return result


def _seed(seed: Any) -> int:
    """A seed as llama.cpp's uint32; None and -1 mean LLAMA_DEFAULT_SEED (random)."""
    if seed is None:
        return LLAMA_DEFAULT_SEED
    seed = _int(seed, "seed")
    if seed == -1:
        return LLAMA_DEFAULT_SEED
    if not 0 <= seed <= 0xFFFFFFFF:
        raise ValueError(f"seed must be in 0..2**32-1 (or None/-1 for random), got {seed}")
    return seed


def _seed_cur(seed: int) -> int:
    """llama.cpp's ``get_rng_seed``: LLAMA_DEFAULT_SEED draws a fresh seed from the OS."""
    return secrets.randbits(32) if seed == LLAMA_DEFAULT_SEED else seed


# ---------------------------------------------------------------------------------------------
# samplers




class _Seeded(Sampler):
    """A sampler that owns a ``std::mt19937`` twin seeded as llama.cpp seeds it."""

    def __init__(self, seed: Any) -> None:
        self.seed = _seed(seed)
        self.seed_cur = _seed_cur(self.seed)
        self._rng = kernels.MT19937(self.seed_cur)

    def reset(self) -> None:
        self.seed_cur = _seed_cur(self.seed)
        self._rng.seed(self.seed_cur)


class Greedy(Sampler):
    """Select the candidate with the largest logit (the first one on ties)."""

    name = "greedy"

    def apply(self, cur_p: TokenDataArray) -> None:
        cur_p.selected = kernels.argmax(cur_p.logits) if cur_p.size else -1


class Dist(_Seeded):
    """Draw from softmax(logits), llama.cpp's ``dist`` sampler.

    Parameters
    ----------
    seed : int or None
        uint32 seed; None, -1 or ``LLAMA_DEFAULT_SEED`` pick a random one (``seed_cur`` holds it).
        A fixed seed gives the same draws on every run and platform: the generator is our own
        mt19937, and one uniform double from it (libstdc++'s formula) picks the first candidate
        whose running probability sum reaches it, as llama.cpp does.
    """

    name = "dist"

    def __init__(self, seed: Any = LLAMA_DEFAULT_SEED) -> None:
        super().__init__(seed)

    def apply(self, cur_p: TokenDataArray) -> None:
        if cur_p.size == 0:
            cur_p.selected = -1
            return
        rnd = self._rng.uniform_double()  # drawn for one candidate too, as llama.cpp does
        if cur_p.size == 1:
            cur_p.selected = 0
            cur_p.p[0] = 1.0
            return
        cur_p.dist_select(rnd)


def _top_k(cur_p: TokenDataArray, k: int) -> None:
    """llama.cpp's ``llama_sampler_top_k_impl``."""
    if k <= 0:
        return
    k = min(k, cur_p.size)
    if not cur_p.sorted:
        cur_p.keep_best(k)
    cur_p.size = k


class TopK(Sampler):
    """Keep the ``k`` candidates with the largest logits, best first; ``k <= 0`` keeps all.

    Exactly ``min(k, size)`` stay even when logits tie at the cut; which of the tied ones stay,
    and in what order, is what llama.cpp's partial sort leaves.
    """

    name = "top-k"

    def __init__(self, k: int) -> None:
        self.k = _int(k, "k")

    def apply(self, cur_p: TokenDataArray) -> None:
        _top_k(cur_p, self.k)


class TopP(Sampler):
    """Nucleus sampling: keep the shortest best-first prefix whose probability reaches ``p``
    (and has at least ``min_keep`` candidates); ``p >= 1`` keeps all. Probabilities are those of
    the softmax over all candidates before the cut, as in llama.cpp."""

    name = "top-p"

    def __init__(self, p: float, min_keep: int = 1) -> None:
        self.p = _f32(p, "p")
        self.min_keep = _int(min_keep, "min_keep", 0)

    def apply(self, cur_p: TokenDataArray) -> None:
        if self.p >= 1.0 or cur_p.size == 0:
            return
        cur_p.softmax(do_sort=False)
        if cur_p.sorted:
            cut = kernels.top_p_cut(cur_p.p, self.p, self.min_keep)
            cur_p.size = cut if cut >= 0 else cur_p.size
            return
        # unsorted: try the best 256 before ordering everything, as llama.cpp does
        positions = cur_p.best_positions(256 if cur_p.size > 1024 else cur_p.size)
        cut = kernels.top_p_cut(cur_p.p[positions], self.p, self.min_keep)
        if cut < 0 and len(positions) < cur_p.size:
            positions = cur_p.best_positions(cur_p.size)
            cut = kernels.top_p_cut(cur_p.p[positions], self.p, self.min_keep)
        cur_p.keep_positions(positions[:cut] if cut >= 0 else positions)
        cur_p.sorted = True


class MinP(Sampler):
    """Keep candidates whose probability is at least ``p`` times the largest one (and at least
    ``min_keep``); ``p <= 0`` keeps all. Unsorted candidates keep their order when that suffices."""

    name = "min-p"

    def __init__(self, p: float, min_keep: int = 1) -> None:
        self.p = _f32(p, "p")
        self.min_keep = _int(min_keep, "min_keep", 0)

    def apply(self, cur_p: TokenDataArray) -> None:
        if self.p <= 0.0 or cur_p.size == 0:
            return
        if not cur_p.sorted:
            kept = kernels.min_p_filter(cur_p.ids, cur_p.logits, cur_p.p, self.p, self.min_keep)
            if kept >= 0:
                cur_p.size = kept
                return
            cur_p.keep_best(cur_p.size)
        cur_p.size = kernels.min_p_cut_sorted(cur_p.logits, self.p, self.min_keep)


def _logf(x: Any) -> Any:
    """C's logf of a float32 scalar or array (llama.cpp's samplers use it; numpy's float32 log
    rounds differently at times)."""
    a = np.ascontiguousarray(x, dtype=_F32).reshape(-1)
    out = np.empty_like(a)
    kernels.logf_array(a, out)
    return out.reshape(np.shape(x)) if np.ndim(x) else out[0]


def _powf(x: Any, y: Any) -> _F32:
    """C's powf of two float32 scalars (llama.cpp's temp-ext and mirostat use it)."""
    return _F32(kernels.powf_scalar(x, y))


def _entropy_terms(p: np.ndarray) -> np.ndarray:
    """-p * logf(p) in float32 (0 * log 0 is NaN, as in C)."""
    with _c_float_math():
        return -p * _logf(p)


def _sum_f32(values: np.ndarray) -> _F32:
    """A float32 sum accumulated left to right, as a C loop does."""
    return np.cumsum(values, dtype=_F32)[-1] if len(values) else _F32(0.0)


class Typical(Sampler):
    """Locally typical sampling: keep the candidates whose surprise is closest to the entropy
    until their probability exceeds ``p`` (at least ``min_keep``); ``p >= 1`` keeps all."""

    name = "typical"

    def __init__(self, p: float, min_keep: int = 1) -> None:
        self.p = _f32(p, "p")
        self.min_keep = _int(min_keep, "min_keep", 0)

    def apply(self, cur_p: TokenDataArray) -> None:
        if self.p >= 1.0 or cur_p.size == 0:
            return
        cur_p.softmax(do_sort=True)
        p = cur_p.p
        entropy = _sum_f32(_entropy_terms(p))
        with _c_float_math():
            shifted = np.abs(-_logf(p) - entropy)
        order = cur_p.sorted_positions(-shifted)  # std::sort by ascending shifted score
        cumulative = np.cumsum(p[order], dtype=_F32)
        enough = np.arange(len(order)) >= self.min_keep - 1 if self.min_keep else True
        over = np.flatnonzero((cumulative > self.p) & enough)
        last = int(over[0]) + 1 if len(over) else len(order)
        cur_p.keep_positions(order[:last])
        cur_p.sorted = False


def _temperature(cur_p: TokenDataArray, temp: float) -> None:
    """llama.cpp's ``llama_sampler_temp_impl``: divide by temp, or keep only the max if <= 0."""
    if cur_p.size == 0:
        return
    if temp <= 0.0:
        kernels.keep_max_only(cur_p.logits)
        return
    with _c_float_math():
        np.divide(cur_p.logits, _F32(temp), out=cur_p.logits)


class Temp(Sampler):
    """Divide logits by ``t``; ``t <= 0`` keeps only the (first) largest logit finite."""

    name = "temp"

    def __init__(self, t: float) -> None:
        self.t = _f32(t, "t")

    def apply(self, cur_p: TokenDataArray) -> None:
        _temperature(cur_p, self.t)


class TempExt(Sampler):
    """Dynamic temperature: with ``delta > 0`` the temperature moves in [t - delta, t + delta]
    with the normalised entropy raised to ``exponent``; otherwise plain :class:`Temp`."""

    name = "temp-ext"

    def __init__(self, t: float, delta: float, exponent: float) -> None:
        self.t = _f32(t, "t")
        self.delta = _f32(delta, "delta")
        self.exponent = _f32(exponent, "exponent")

    def apply(self, cur_p: TokenDataArray) -> None:
        if self.delta <= 0.0:
            _temperature(cur_p, self.t)
            return
        if cur_p.size <= 1:
            return
        cur_p.softmax(do_sort=True)
        with _c_float_math():
            min_temp = max(_F32(0.0), _F32(self.t) - _F32(self.delta))
            max_temp = _F32(self.t) + _F32(self.delta)
            max_entropy = -_logf(_F32(1.0) / _F32(cur_p.size))
            p = cur_p.p
            entropy = _sum_f32(_entropy_terms(p[p > 0.0]))
            normalized = entropy / max_entropy
            dyn_temp = min_temp + (max_temp - min_temp) * _powf(normalized, self.exponent)
            _temperature(cur_p, float(dyn_temp))
            # probabilities again, this time in double
            logits = cur_p.logits.astype(np.float64)
            weights = np.exp(logits - logits[0])
            cur_p.p[:] = weights.astype(_F32).astype(np.float64) / np.cumsum(weights)[-1]


class XTC(_Seeded):
    """Exclude Top Choices: with probability ``p``, drop every candidate whose probability is at
    least ``t`` except the least likely of them (keeping at least ``min_keep``)."""

    name = "xtc"

    def __init__(self, p: float, t: float, min_keep: int, seed: Any = LLAMA_DEFAULT_SEED) -> None:
        self.p = _f32(p, "p")
        self.t = _f32(t, "t")
        self.min_keep = _int(min_keep, "min_keep", 0)
        super().__init__(seed)

    def apply(self, cur_p: TokenDataArray) -> None:
        if self.p <= 0.0 or self.t > 0.5 or cur_p.size < 2:
            return
        if self._rng.uniform_float() > self.p:
            return
        cur_p.softmax(do_sort=True)
        above = cur_p.p >= self.t
        # the last position of the leading run at or above the threshold (0 if there is none)
        pos_last = max(int(np.argmin(above)) - 1, 0) if not above.all() else cur_p.size - 1
        if cur_p.size - pos_last >= self.min_keep and pos_last > 0:
            cur_p.drop_front(pos_last)


class TopNSigma(Sampler):
    """Set to -inf the logits more than ``n`` standard deviations below the largest one (order
    and probabilities untouched, as current llama.cpp); ``n <= 0`` does nothing."""

    name = "top-n-sigma"

    def __init__(self, n: float) -> None:
        self.n = _f32(n, "n")

    def apply(self, cur_p: TokenDataArray) -> None:
        if self.n <= 0.0 or cur_p.size <= 1:
            return
        kernels.top_n_sigma_mask(cur_p.logits, self.n)


def _c_int(value: _F32) -> int:
    """float -> int as x86 truncates it: NaN and out-of-range values become INT_MIN."""
    if not -(2.0**31) < value < 2.0**31:
        return -(2**31)
    return int(value)


class _Mirostat(_Seeded):
    """What both mirostats share: sort and softmax, truncate, softmax again, draw, then move
    ``mu`` by ``eta`` towards the target surprise ``tau``."""

    def __init__(self, seed: Any, tau: float, eta: float) -> None:
        self.tau = _f32(tau, "tau")
        self.eta = _f32(eta, "eta")
        super().__init__(seed)
        self.mu = _F32(2.0) * _F32(self.tau)

    def reset(self) -> None:
        self.mu = _F32(2.0) * _F32(self.tau)
        super().reset()

    def _truncate(self, cur_p: TokenDataArray) -> None:
        raise NotImplementedError

    def apply(self, cur_p: TokenDataArray) -> None:
        if cur_p.size == 0:
            cur_p.selected = -1
            return
        cur_p.softmax(do_sort=True)
        self._truncate(cur_p)
        cur_p.softmax(do_sort=True)
        if cur_p.size >= 2:  # std::discrete_distribution draws nothing for one weight
            cur_p.selected = kernels.discrete_select(cur_p.p, self._rng.uniform_double())
        else:
            cur_p.selected = 0
        # mu -= eta * (observed surprise - tau), in float
        with _c_float_math():
            observed = -np.log2(_F32(cur_p.p[cur_p.selected]))
        self.mu = _F32(self.mu - _F32(self.eta) * (observed - _F32(self.tau)))


class Mirostat(_Mirostat):
    """Mirostat 1.0: estimate the Zipf exponent from the best ``m`` candidates, keep the k that
    targets surprise ``tau``, draw, and move ``mu`` by ``eta``. Selects a token."""

    name = "mirostat"

    def __init__(self, n_vocab: int, seed: Any, tau: float, eta: float, m: int) -> None:
        self.n_vocab = _int(n_vocab, "n_vocab", 1)
        self.m = _int(m, "m")
        super().__init__(seed, tau, eta)

    def _truncate(self, cur_p: TokenDataArray) -> None:
        # llama.cpp's size_t(m - 1): m <= 0 wraps to "no limit"
        count = min(self.m - 1 if self.m >= 1 else cur_p.size, cur_p.size - 1)
        ranks = np.arange(1, count + 1, dtype=_F32)
        with _c_float_math():
            t = _logf((ranks + _F32(1.0)) / ranks)
            b = _logf(cur_p.p[:count] / cur_p.p[1:count + 1])
            s_hat = _sum_f32(t * b) / _sum_f32(t * t)
            epsilon_hat = s_hat - _F32(1.0)
            k = _powf((epsilon_hat * _powf(2.0, self.mu))
                      / (_F32(1.0) - _powf(self.n_vocab, -epsilon_hat)), _F32(1.0) / s_hat)
        _top_k(cur_p, max(_c_int(k), 1))


class MirostatV2(_Mirostat):
    """Mirostat 2.0: drop candidates whose surprise exceeds ``mu``, draw, and move ``mu`` by
    ``eta`` towards the target surprise ``tau``. Selects a token."""

    name = "mirostat-v2"

    def __init__(self, seed: Any, tau: float, eta: float) -> None:
        super().__init__(seed, tau, eta)

    def _truncate(self, cur_p: TokenDataArray) -> None:
        with _c_float_math():
            too_surprising = np.flatnonzero(-np.log2(cur_p.p) > self.mu)
        cur_p.size = max(int(too_surprising[0]) if len(too_surprising) else cur_p.size, 1)


class _TokenRing:
    """llama.cpp's fixed-capacity ring buffer of token ids (oldest dropped when full)."""

    def __init__(self, capacity: int) -> None:
        self._data = np.zeros(capacity, dtype=np.int32)  # [capacity]
        self._first = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, token: int) -> None:
        capacity = len(self._data)
        self._data[(self._first + self._size) % capacity] = token
        if self._size == capacity:
            self._first = (self._first + 1) % capacity
        else:
            self._size += 1

    def front(self) -> int:
        return int(self._data[self._first])

    def recent(self, n: int) -> np.ndarray:
        """The last ``n`` tokens, most recent first (llama.cpp's ``rat(0..n-1)``)."""
        newest = self._first + self._size - 1
        return self._data[(newest - np.arange(n)) % len(self._data)]

    def clear(self) -> None:
        self._first = 0
        self._size = 0


class Penalties(Sampler):
    """Repetition, frequency and presence penalties over the last ``last_n`` accepted tokens.

    A penalised logit is divided by ``repeat`` (multiplied when <= 0), then lowered by
    ``count * freq + present``. ``last_n = 0`` disables it (negative counts as 0).
    """

    name = "penalties"

    def __init__(self, last_n: int, repeat: float, freq: float, present: float) -> None:
        self.last_n = max(_int(last_n, "last_n"), 0)
        self.repeat = _f32(repeat, "repeat")
        self.freq = _f32(freq, "freq")
        self.present = _f32(present, "present")
        self._prev = _TokenRing(self.last_n)
        self._count: dict[int, int] = {}

    def accept(self, token: int) -> None:
        if self.last_n == 0:
            return
        token = _int(token, "token")
        self._count[token] = self._count.get(token, 0) + 1
        if len(self._prev) >= self.last_n:
            oldest = self._prev.front()
            self._count[oldest] -= 1
            if self._count[oldest] == 0:
                del self._count[oldest]
        self._prev.push(token)

    def reset(self) -> None:
        self._prev.clear()
        self._count.clear()

    def apply(self, cur_p: TokenDataArray) -> None:
        if self.last_n == 0 or (self.repeat == 1.0 and self.freq == 0.0 and self.present == 0.0):
            return
        if self._count:
            tokens = np.array(sorted(self._count), dtype=np.int64)
            counts = np.array([self._count[t] for t in tokens.tolist()], dtype=_F32)
            positions = cur_p.positions_of(tokens)
            found = positions >= 0
            positions, counts = positions[found], counts[found]
            logits = cur_p.logits
            penalised = logits[positions]
            with _c_float_math():
                penalised = np.where(penalised <= 0, penalised * _F32(self.repeat),
                                     penalised / _F32(self.repeat))
                penalised -= counts * _F32(self.freq) + _F32(self.present)
            logits[positions] = penalised
        cur_p.sorted = False


# DRY: how long breaker strings may be and how many tokens their tails keep (llama.cpp's limits)
_DRY_MAX_CHAR_LEN = 40
_DRY_MAX_SEQ_LEN = 20
# log of the largest float: caps the exponent of base ** (repeat - allowed)
_FLOAT_MAX_LOG = _F32(88.7228391)


class DRY(Sampler):
    """DRY ("don't repeat yourself"): penalise tokens that would extend a repeat of the recent
    context by ``multiplier * base ** (length - allowed_length)``.

    Parameters (current llama.cpp's ``llama_sampler_init_dry`` order)
    ----------
    vocab : object or None
        Needed only to turn string breakers into token sequences: it must have ``n_tokens``,
        ``tokenize(text, add_special=False, parse_special=False)`` and either
        ``detokenize(ids, remove_special=False, unparse_special=True)`` or
        ``token_to_piece(token, lstrip, special)``. Like llama.cpp this scans every token of the
        vocabulary once, when the sampler is made.
    multiplier, base, allowed_length
        The penalty is ``multiplier * base ** (repeat_length - allowed_length)``.
    penalty_last_n : int
        How many recent tokens to scan; 0 disables DRY and so, in current llama.cpp (which no
        longer takes the context length), does any negative value.
    seq_breakers : iterable
        Sequence breakers: strings (processed through ``vocab``, at most 40 bytes each, tails cut
        to 20 tokens) or pre-tokenized sequences of token ids (first id = head; as llama.cpp's
        test hook ``llama_sampler_init_dry_testing``).

    DRY is disabled when ``multiplier == 0``, ``base < 1`` or ``penalty_last_n == 0``.
    """

    name = "dry"

    def __init__(self, vocab: Any, multiplier: float, base: float, allowed_length: int,
                 penalty_last_n: int,
                 seq_breakers: Iterable[str | bytes | Sequence[int]] = ()) -> None:
        self.multiplier = _f32(multiplier, "multiplier")
        self.base = _f32(base, "base")
        self.allowed_length = _int(allowed_length, "allowed_length")
        self.penalty_last_n = _int(penalty_last_n, "penalty_last_n")
        self._enabled = self.multiplier != 0.0 and self.base >= 1.0 and self.penalty_last_n != 0
        self._last_n = max(self.penalty_last_n, 0) if self._enabled else 0
        # head token -> tails that complete a breaker after it
        self._breakers: dict[int, list[tuple[int, ...]]] = {}
        if self._enabled:
            for breaker in seq_breakers:
                self._add_breaker(vocab, breaker)
        self._last_tokens = _TokenRing(self._last_n)

    def _add_breaker(self, vocab: Any, breaker: str | bytes | Sequence[int]) -> None:
        if isinstance(breaker, (str, bytes)):
            text = breaker.encode("utf-8") if isinstance(breaker, str) else bytes(breaker)
            if text:
                if vocab is None:
                    raise ValueError("DRY needs a vocab to tokenize string sequence breakers; "
                                     "pass one or give pre-tokenized breakers")
                self._add_overlapping_sequences(vocab, text[:_DRY_MAX_CHAR_LEN])
            return
        tokens = tuple(_int(t, "breaker token") for t in breaker)
        if tokens:
            self._add_sequence(tokens[0], tokens[1:])

    def _add_sequence(self, head: int, tail: tuple[int, ...]) -> None:
        tails = self._breakers.setdefault(head, [])
        if tail not in tails:
            tails.append(tail)

    def _add_overlapping_sequences(self, vocab: Any, text: bytes) -> None:
        """Every token that contains ``text``, or ends with a prefix of it (then with the rest
        of ``text`` tokenized as its tail) — Koboldcpp's approach, as llama.cpp ports it."""
        for token in range(_int(vocab.n_tokens, "vocab.n_tokens", 0)):
            word = _token_text(vocab, token)
            if text in word:
                self._add_sequence(token, ())
                continue
            pos = word.find(text[:1])
            while pos >= 0:
                matched = 1
                while matched < len(text) and pos + matched < len(word):
                    if word[pos + matched] != text[matched]:
                        break
                    matched += 1
                else:
                    rest = text[matched:].decode("utf-8", errors="replace")
                    tail = vocab.tokenize(rest, add_special=False, parse_special=False)
                    self._add_sequence(token, tuple(int(t) for t in tail[:_DRY_MAX_SEQ_LEN]))
                pos = word.find(text[:1], pos + 1)

    def accept(self, token: int) -> None:
        if self._last_n > 0:
            self._last_tokens.push(_int(token, "token"))

    def reset(self) -> None:
        self._last_tokens.clear()

    def apply(self, cur_p: TokenDataArray) -> None:
        if not self._enabled:
            return
        n = len(self._last_tokens)
        if n <= self.allowed_length:
            return
        recent = self._last_tokens.recent(n)  # most recent first
        rep_limit = self._restart_limit(recent)
        if rep_limit < self.allowed_length:
            return
        repeat = np.empty(n, dtype=np.int32)
        kernels.dry_repeat_counts(recent, rep_limit, repeat)
        # a repeat ending at position i would be extended by the token that followed it
        ends = np.flatnonzero(repeat[:n - 1] >= self.allowed_length)
        if len(ends):
            followers = recent[n - 2 - ends]
            tokens, which = np.unique(followers, return_inverse=True)
            longest = np.zeros(len(tokens), dtype=np.int64)
            np.maximum.at(longest, which, repeat[ends])
            self._penalise(cur_p, tokens, longest)
        cur_p.sorted = False

    def _restart_limit(self, recent: np.ndarray) -> int:
        """Step 1: the nearest breaker in the context limits how far back a repeat may reach."""
        if not self._breakers:
            return len(recent)
        heads = np.fromiter(self._breakers, dtype=np.int64, count=len(self._breakers))
        for i in np.flatnonzero(np.isin(recent, heads)).tolist():
            longest = -1
            for tail in self._breakers[int(recent[i])]:
                if longest < len(tail) <= i and all(
                        tail[k] == recent[i - k - 1] for k in range(len(tail))):
                    longest = len(tail)
            if longest >= 0:
                return i - longest
        return len(recent)

    def _penalise(self, cur_p: TokenDataArray, tokens: np.ndarray, longest: np.ndarray) -> None:
        """Step 4: lower the logits of tokens that would extend a repeat (not lone breakers)."""
        single = [t for t, tails in self._breakers.items() if () in tails]
        keep = ~np.isin(tokens, single)
        tokens, longest = tokens[keep], longest[keep]
        positions = cur_p.positions_of(tokens)
        found = positions >= 0
        positions, longest = positions[found], longest[found]
        exponent = longest - self.allowed_length
        if self.base > 1.000001:
            max_exponent = int(_FLOAT_MAX_LOG / np.log(_F32(self.base)))
            if max_exponent > 0:
                exponent = np.minimum(exponent, max_exponent)
        with _c_float_math():
            penalty = self.multiplier * np.power(float(self.base), exponent.astype(np.float64))
            logits = cur_p.logits
            logits[positions] -= penalty.astype(_F32)


def _token_text(vocab: Any, token: int) -> bytes:
    """One token's text as llama.cpp's DRY sees it (``detokenize({id}, special=true)``)."""
    if hasattr(vocab, "detokenize"):
        text = vocab.detokenize([token], remove_special=False, unparse_special=True)
    else:
        text = vocab.token_to_piece(token, 0, True)
    return text.encode("utf-8") if isinstance(text, str) else bytes(text)


class LogitBias(Sampler):
    """Add fixed biases to chosen tokens' logits (``-inf`` bans a token).

    ``biases`` is a mapping token -> bias or an iterable of (token, bias) pairs; a token listed
    twice gets both biases while it sits at its own index, else the first (as llama.cpp).
    """

    name = "logit-bias"

    def __init__(self, n_vocab: int, biases: Mapping[int, float] | Iterable[tuple[int, float]]
                 ) -> None:
        self.n_vocab = _int(n_vocab, "n_vocab", 0)
        pairs = biases.items() if isinstance(biases, Mapping) else biases
        self.biases = [(_int(t, "token"), _f32(b, "bias")) for t, b in pairs]
        self._tokens = np.array([t for t, _ in self.biases], dtype=np.int64)
        self._values = np.array([b for _, b in self.biases], dtype=_F32)

    def apply(self, cur_p: TokenDataArray) -> None:
        if not self.biases:
            return
        logits, tokens = cur_p.logits, self._tokens
        # candidates still at their own index take the bias directly
        direct = cur_p.at_own_index(tokens)
        with _c_float_math():
            np.add.at(logits, tokens[direct], self._values[direct])
        if direct.all():
            return
        # the rest are searched for; a token listed twice takes its first bias
        search, first = np.unique(tokens[~direct], return_index=True)
        values = self._values[~direct][first]
        positions = cur_p.positions_of(search)
        found = positions >= 0
        with _c_float_math():
            logits[positions[found]] += values[found]
