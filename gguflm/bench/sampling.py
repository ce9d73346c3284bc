"""``python -m gguflm.bench sampling``: microseconds per ``sample`` on a 262,144-logit row.

Times llama.cpp's default chain (``common_sampler`` with default parameters: penalties -> dry ->
top-n-sigma -> top-k 40 -> typical -> top-p 0.95 -> min-p 0.05 -> xtc -> temp-ext 0.8 -> dist) on
realistic logits (standard normal x 3), and, when llama-cpp-python is importable, the same chain
in llama.cpp itself (candidates filled from numpy, then ``llama_sampler_apply`` + accept).
"""

from __future__ import annotations

import argparse
import ctypes
import time
from collections.abc import Callable

import numpy as np

from gguflm.sampling import SamplingParams, common_sampler
from gguflm.samplers import TokenDataArray

GEMMA_VOCAB = 262_144
# llama.cpp's Gemma 3 270M decode speed on this machine class (SPEC.md's reference table)
GEMMA_TG_TOKENS_PER_S = 78
GEMMA_DECODE_US = 1e6 / GEMMA_TG_TOKENS_PER_S

#: llama.cpp's ``llama_token_data`` as a numpy record (id, logit, p)
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


class LlamaCppSamplers:
    """llama.cpp's own samplers through llama-cpp-python's bindings, on numpy candidates.

    Raises ImportError when ``llama_cpp`` is not installed. Each ``init_*`` call returns a sampler
    pointer owned by this object (freed with it).
    """

    def __init__(self) -> None:
        import llama_cpp

        self.lib = llama_cpp
        self._owned: list = []

    def __del__(self) -> None:
        for sampler in getattr(self, "_owned", ()):
            self.lib.llama_sampler_free(sampler)

    def init(self, name: str, *args):
        """``llama_sampler_init_<name>(*args)``, e.g. ``init("top_k", 40)``."""
        sampler = getattr(self.lib, f"llama_sampler_init_{name}")(*args)
        self._owned.append(sampler)
        return sampler

    def chain(self, samplers: list, no_perf: bool = True):
        """A chain that owns ``samplers`` (they must come from :meth:`init`)."""
        params = self.lib.llama_sampler_chain_default_params()
        params.no_perf = no_perf
        chain = self.lib.llama_sampler_chain_init(params)
        for sampler in samplers:
            self._owned.remove(sampler)
            self.lib.llama_sampler_chain_add(chain, sampler)
        self._owned.append(chain)
        return chain

    def logit_bias(self, n_vocab: int, biases: list[tuple[int, float]]):
        entries = (self.lib.llama_logit_bias * len(biases))(*biases)
        return self.init("logit_bias", n_vocab, len(biases), entries)

    def dry(self, multiplier: float, base: float, allowed_length: int, penalty_last_n: int):
        """DRY without sequence breakers (those need a llama.cpp vocab)."""
        return self.init("dry", None, multiplier, base, allowed_length, penalty_last_n, None, 0)

    def common_chain(self, params: SamplingParams, n_vocab: int):
        """llama.cpp's ``common_sampler_init`` chain for ``params`` (no logit bias, no DRY
        breakers), built from the C samplers."""
        init = self.init
        makers = {
            "penalties": lambda: init("penalties", n_vocab, params.penalty_last_n,
                                      params.penalty_repeat, params.penalty_freq,
                                      params.penalty_present),
            "dry": lambda: self.dry(params.dry_multiplier, params.dry_base,
                                    params.dry_allowed_length, params.dry_penalty_last_n),
            "top_n_sigma": lambda: init("top_n_sigma", params.top_n_sigma),
            "top_k": lambda: init("top_k", params.top_k),
            "typ_p": lambda: init("typical", params.typ_p, params.min_keep),
            "top_p": lambda: init("top_p", params.top_p, params.min_keep),
            "min_p": lambda: init("min_p", params.min_p, params.min_keep),
            "xtc": lambda: init("xtc", params.xtc_probability, params.xtc_threshold,
                                params.min_keep, params.seed),
            "temperature": lambda: init("temp_ext", params.temp, params.dynatemp_range,
                                        params.dynatemp_exponent),
        }
        samplers = [makers[name]() for name in params.samplers]
        return self.chain([*samplers, init("dist", params.seed)])

    def candidates(self, n: int) -> LlamaCppCandidates:
        return LlamaCppCandidates(self.lib, n)


class LlamaCppCandidates:
    """A ``llama_token_data_array`` over a numpy record buffer, refilled per row."""

    def __init__(self, lib, n: int) -> None:
        self.lib = lib
        self.buffer = np.zeros(n, dtype=TOKEN_DATA)
        self._arange = np.arange(n, dtype=np.int32)
        self.array = lib.llama_token_data_array(
            data=self.buffer.ctypes.data_as(ctypes.POINTER(lib.llama_token_data)), size=n,
            selected=-1, sorted=False)

    def load(self, logits: np.ndarray, p: np.ndarray | None = None) -> None:
        """Candidates 0..n-1 with these logits (and p, default 0), as llama_sampler_sample."""
        n = len(logits)
        self.buffer["id"][:n] = self._arange[:n]
        self.buffer["logit"][:n] = logits
        self.buffer["p"][:n] = 0.0 if p is None else p
        self.array.data = self.buffer.ctypes.data_as(ctypes.POINTER(self.lib.llama_token_data))
        self.array.size = n
        self.array.selected = -1
        self.array.sorted = False

    def apply(self, sampler) -> None:
        self.lib.llama_sampler_apply(sampler, ctypes.byref(self.array))

    def view(self) -> np.ndarray:
        """The current candidates (llama.cpp may have moved its data pointer, as XTC does)."""
        start = (ctypes.addressof(self.array.data.contents) - self.buffer.ctypes.data)
        start //= TOKEN_DATA.itemsize
        return self.buffer[start:start + self.array.size]

    @property
    def selected(self) -> int:
        return self.array.selected

    @property
    def is_sorted(self) -> bool:
        return bool(self.array.sorted)

    def selected_id(self) -> int:
        return int(self.view()["id"][self.array.selected])


class _RowContext:
    """The one method of a Context that sampling needs."""

    def __init__(self, row: np.ndarray) -> None:
        self.row = row

    def get_logits_ith(self, idx: int) -> np.ndarray:
        return self.row


def _median_us(step: Callable[[], object], calls: int,
               prepare: Callable[[], object] | None = None) -> float:
    """Median wall time of ``step`` in microseconds over ``calls`` calls, each timed alone;
    ``prepare`` runs untimed before every call. The median resists other processes' noise."""
    step()  # warm up buffers
    times = np.empty(calls)
    for i in range(calls):
        if prepare is not None:
            prepare()
        start = time.perf_counter()
        step()
        times[i] = time.perf_counter() - start
    return float(np.median(times) * 1e6)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gguflm.bench sampling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-vocab", type=int, default=GEMMA_VOCAB)
    parser.add_argument("--calls", type=int, default=400, help="timed calls per figure")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    row = (rng.standard_normal(args.n_vocab) * 3.0).astype(np.float32)
    params = SamplingParams(seed=args.seed)
    ctx = _RowContext(row)

    chain = common_sampler(params, n_vocab=args.n_vocab)
    print(f"chain: {chain!r}, {args.n_vocab} logits (standard normal x 3)")
    ours = _median_us(lambda: chain.sample(ctx, -1), args.calls)
    print(f"gguflm    sample (copy row, apply, accept):  {ours:8.1f} us "
          f"= {100 * ours / GEMMA_DECODE_US:.1f}% of a Gemma decode step "
          f"({GEMMA_DECODE_US / 1000:.1f} ms at {GEMMA_TG_TOKENS_PER_S} tok/s)")
    cur_p = TokenDataArray.from_logits(row)

    def apply_accept() -> None:
        chain.apply(cur_p)
        chain.accept(cur_p.selected_id)

    applied = _median_us(apply_accept, args.calls, lambda: cur_p.load_logits(row))
    print(f"gguflm    apply + accept (row loaded untimed): {applied:6.1f} us")
    greedy_chain = common_sampler(SamplingParams(seed=args.seed, temp=0.0), n_vocab=args.n_vocab)
    greedy = _median_us(lambda: greedy_chain.sample(ctx, -1), args.calls)
    print(f"gguflm    same chain at temp 0:              {greedy:8.1f} us")

    try:
        reference = LlamaCppSamplers()
    except ImportError:
        print("llama.cpp: llama_cpp is not importable; no side-by-side figure")
        return 0
    ll_chain = reference.common_chain(params, args.n_vocab)
    candidates = reference.candidates(args.n_vocab)

    def llama_cpp_apply_accept() -> None:
        candidates.apply(ll_chain)
        reference.lib.llama_sampler_accept(ll_chain, candidates.selected_id())

    theirs = _median_us(llama_cpp_apply_accept, args.calls, lambda: candidates.load(row))
    print(f"llama.cpp apply + accept, same chain:        {theirs:8.1f} us (its candidates filled "
          f"untimed; llama_sampler_sample fills them in a C++ loop)")
    mine = common_sampler(params, n_vocab=args.n_vocab)
    fresh = reference.common_chain(params, args.n_vocab)
    same = 0
    for step in range(20):
        step_row = np.random.default_rng(args.seed + step).standard_normal(args.n_vocab)
        step_row = (step_row * 3.0).astype(np.float32)
        token = mine.sample(_RowContext(step_row), -1)
        candidates.load(step_row)
        candidates.apply(fresh)
        reference.lib.llama_sampler_accept(fresh, candidates.selected_id())
        same += token == candidates.selected_id()
    print(f"seed {args.seed}: the same token as llama.cpp at {same} of 20 steps")
    return 0
