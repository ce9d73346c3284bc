"""The sampler chain and llama.cpp's default chain (``common/sampling.cpp``) built from parameters.

>>> chain = common_sampler(SamplingParams(seed=1))   # penalties -> ... -> temp-ext -> dist
>>> token = chain.sample(ctx, -1)                    # reads ctx.get_logits_ith(-1)
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gguflm.samplers import (
    DRY,
    LLAMA_DEFAULT_SEED,
    XTC,
    Dist,
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

__all__ = ["SamplerChain", "SamplingParams", "common_sampler", "DEFAULT_SAMPLERS"]


class SamplerChain(Sampler):
    """Samplers applied in order; a chain is itself a sampler (llama.cpp's ``chain``).

    Parameters
    ----------
    samplers : iterable of Sampler, optional
        Initial samplers, in application order.
    no_perf : bool
        Skip timing (``perf()`` then reports 0 ms; ``n_sample`` still counts).

    Notes
    -----
    :meth:`sample` reuses one candidates array for every row, so a chain allocates nothing per
    token once it has seen the vocabulary size. Timing covers ``apply`` and ``accept``, as
    llama.cpp's ``llama_perf_sampler`` does.
    """

    name = "chain"

    def __init__(self, samplers: Iterable[Sampler] | None = None, *, no_perf: bool = False
                 ) -> None:
        self.samplers: list[Sampler] = []
        self.no_perf = bool(no_perf)
        self._t_sample_ns = 0
        self._n_sample = 0
        for sampler in samplers or ():
            self.add(sampler)

    def add(self, sampler: Sampler) -> None:
        """Append ``sampler`` to the chain (the chain owns it from then on)."""
        if not isinstance(sampler, Sampler):
            raise TypeError(f"expected a gguflm sampler, got {type(sampler).__name__}")
        self.samplers.append(sampler)

    def apply(self, cur_p: TokenDataArray) -> None:
        start = 0 if self.no_perf else time.perf_counter_ns()
        for sampler in self.samplers:
            sampler.apply(cur_p)
        if not self.no_perf:
            self._t_sample_ns += time.perf_counter_ns() - start

    def accept(self, token: int) -> None:
        start = 0 if self.no_perf else time.perf_counter_ns()
        for sampler in self.samplers:
            sampler.accept(token)
        self._n_sample += 1
        if not self.no_perf:
            self._t_sample_ns += time.perf_counter_ns() - start

    def reset(self) -> None:
        for sampler in self.samplers:
            sampler.reset()

    def clone(self) -> SamplerChain:
        """A chain of clones of every sampler, with fresh performance counters."""
        return SamplerChain([s.clone() for s in self.samplers], no_perf=self.no_perf)

    def perf(self) -> dict:
        """``{"t_sample_ms": float, "n_sample": int}`` like ``llama_perf_sampler``."""
        return {"t_sample_ms": self._t_sample_ns * 1e-6, "n_sample": self._n_sample}

    def perf_reset(self) -> None:
        """Zero the performance counters."""
        self._t_sample_ns = 0
        self._n_sample = 0

    def get_seed(self) -> int:
        """The seed in use by the last seeded dist/mirostat sampler (``llama_sampler_get_seed``),
        or ``LLAMA_DEFAULT_SEED`` when there is none."""
        for sampler in reversed(self.samplers):
            if isinstance(sampler, SamplerChain):
                seed = sampler.get_seed()
            elif isinstance(sampler, (Dist, Mirostat, MirostatV2)):
                seed = sampler.seed_cur
            else:
                continue
            if seed != LLAMA_DEFAULT_SEED:
                return seed
        return LLAMA_DEFAULT_SEED

    def __len__(self) -> int:
        return len(self.samplers)

    def __repr__(self) -> str:
        return "SamplerChain(" + " -> ".join(s.name for s in self.samplers) + ")"


#: ``common_params_sampling::samplers``: the order of llama.cpp's default chain
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                    "temperature")


@dataclass
class SamplingParams:
    """llama.cpp's ``common_params_sampling``: the fields that shape the chain, same defaults.

    ``samplers`` uses llama.cpp's canonical names (see :data:`DEFAULT_SAMPLERS`; "infill" and
    "adaptive_p" are not provided). ``logit_bias`` maps token -> bias (or lists pairs).
    ``grammar`` (a :class:`gguflm.Grammar` or GBNF text), ``grammar_lazy`` and
    ``grammar_triggers`` (:class:`gguflm.grammar.GrammarTrigger`) add llama.cpp's grammar
    sampler the way its common sampler does (see :class:`gguflm.grammar.GrammarChain`).
    ``dry_penalty_last_n`` defaults to 64 as in current
    llama.cpp, whose DRY no longer reads "-1 = the whole context" (any negative value now scans
    nothing).
    """

    seed: int = LLAMA_DEFAULT_SEED
    min_keep: int = 0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    xtc_probability: float = 0.00
    xtc_threshold: float = 0.10
    typ_p: float = 1.00
    temp: float = 0.80
    dynatemp_range: float = 0.00
    dynatemp_exponent: float = 1.00
    penalty_last_n: int = 64
    penalty_repeat: float = 1.00
    penalty_freq: float = 0.00
    penalty_present: float = 0.00
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    mirostat: int = 0
    top_n_sigma: float = -1.00
    mirostat_tau: float = 5.00
    mirostat_eta: float = 0.10
    no_perf: bool = False
    dry_sequence_breakers: Sequence[str | Sequence[int]] = ("\n", ":", "\"", "*")
    samplers: Sequence[str] = DEFAULT_SAMPLERS
    logit_bias: Mapping[int, float] | Sequence[tuple[int, float]] = field(default_factory=dict)
    grammar: Any = None
    grammar_lazy: bool = False
    grammar_triggers: Sequence[Any] = ()


def common_sampler(params: SamplingParams | None = None, *, vocab: Any = None,
                   n_vocab: int | None = None) -> SamplerChain | Sampler:
    """Build llama.cpp's sampler chain from ``params`` as ``common_sampler_init`` does.

    Order: logit bias (when any), then ``params.samplers`` (by default penalties -> dry ->
    top-n-sigma -> top-k -> typical -> top-p -> min-p -> xtc -> temp-ext) and dist; or, with
    ``mirostat`` 1 or 2, temp -> mirostat. A temperature <= 0 is not special-cased (current
    llama.cpp): temp-ext leaves only the best logit finite and dist then picks it.

    Parameters
    ----------
    params : SamplingParams, optional
        Defaults to llama.cpp's defaults.
    vocab : object, optional
        The model's vocabulary; DRY needs it to tokenize string sequence breakers when enabled,
        a grammar needs it, and it supplies ``n_vocab`` through ``vocab.n_tokens``.

    Returns
    -------
    SamplerChain, or a :class:`gguflm.grammar.GrammarChain` around it when ``params.grammar``
    is set.
    n_vocab : int, optional
        Vocabulary size for mirostat and logit bias when no ``vocab`` is given.
    """
    params = SamplingParams() if params is None else params
    if n_vocab is None and vocab is not None:
        n_vocab = int(vocab.n_tokens)
    chain = SamplerChain(no_perf=params.no_perf)
    if params.logit_bias:
        chain.add(LogitBias(_need_n_vocab(n_vocab, "logit bias"), params.logit_bias))
    if params.mirostat == 0:
        for name in params.samplers:
            chain.add(_named_sampler(name, params, vocab))
        chain.add(Dist(params.seed))
    elif params.mirostat == 1:
        chain.add(Temp(params.temp))
        chain.add(Mirostat(_need_n_vocab(n_vocab, "mirostat"), params.seed, params.mirostat_tau,
                           params.mirostat_eta, 100))
    elif params.mirostat == 2:
        chain.add(Temp(params.temp))
        chain.add(MirostatV2(params.seed, params.mirostat_tau, params.mirostat_eta))
    else:
        raise ValueError(f"unknown mirostat version {params.mirostat!r} (0, 1 or 2)")
    if params.grammar is not None and params.grammar != "":
        from gguflm.grammar.sampler import GrammarChain, grammar_sampler

        if vocab is None:
            raise ValueError("a grammar needs the vocabulary: pass vocab=")
        return GrammarChain(chain, grammar_sampler(vocab, params.grammar, lazy=params.grammar_lazy,
                                                   triggers=params.grammar_triggers))
    return chain


def _need_n_vocab(n_vocab: int | None, what: str) -> int:
    if n_vocab is None:
        raise ValueError(f"{what} needs the vocabulary size: pass vocab= or n_vocab=")
    return n_vocab


def _named_sampler(name: str, params: SamplingParams, vocab: Any) -> Sampler:
    """One entry of ``params.samplers`` as ``common_sampler_init`` builds it."""
    if name == "penalties":
        return Penalties(params.penalty_last_n, params.penalty_repeat, params.penalty_freq,
                         params.penalty_present)
    if name == "dry":
        return DRY(vocab, params.dry_multiplier, params.dry_base, params.dry_allowed_length,
                   params.dry_penalty_last_n, params.dry_sequence_breakers)
    if name == "top_n_sigma":
        return TopNSigma(params.top_n_sigma)
    if name == "top_k":
        return TopK(params.top_k)
    if name == "typ_p":
        return Typical(params.typ_p, params.min_keep)
    if name == "top_p":
        return TopP(params.top_p, params.min_keep)
    if name == "min_p":
        return MinP(params.min_p, params.min_keep)
    if name == "xtc":
        return XTC(params.xtc_probability, params.xtc_threshold, params.min_keep, params.seed)
    if name == "temperature":
        return TempExt(params.temp, params.dynatemp_range, params.dynatemp_exponent)
    raise ValueError(f"unknown sampler {name!r}; known: {', '.join(DEFAULT_SAMPLERS)}")
