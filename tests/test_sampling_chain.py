"""The chain's interface, llama.cpp's default chain, the candidates array and argument checks."""

from __future__ import annotations

import numpy as np
import pytest

import gguflm
from _llama import import_peer
from gguflm.sampling import DEFAULT_SAMPLERS, SamplerChain, SamplingParams, common_sampler
from gguflm.samplers import (
    DRY,
    LLAMA_DEFAULT_SEED,
    XTC,
    Dist,
    Greedy,
    LogitBias,
    MinP,
    Mirostat,
    Penalties,
    Temp,
    TokenDataArray,
    TopK,
    TopP,
)


class FakeContext:
    """Just ``get_logits_ith``, as the real Context will provide."""

    def __init__(self, rows: dict[int, np.ndarray]) -> None:
        self.rows = rows
        self.asked: list[int] = []

    def get_logits_ith(self, idx: int) -> np.ndarray | None:
        self.asked.append(idx)
        return self.rows.get(idx)


def test_public_names():
    assert gguflm.SamplerChain is SamplerChain
    assert gguflm.samplers.TokenDataArray is TokenDataArray


def test_sample_reads_the_row_selects_and_accepts():
    row = np.array([0.5, 3.0, 1.0, 2.9], dtype=np.float32)
    ctx = FakeContext({-1: row, 2: row[::-1].copy()})
    penalties = Penalties(4, 100.0, 0.0, 0.0)
    chain = SamplerChain([penalties, Greedy()])
    assert chain.sample(ctx) == 1
    assert ctx.asked == [-1]
    # token 1 was accepted into the penalties: next time 3 wins
    assert chain.sample(ctx, -1) == 3
    assert chain.sample(ctx, 2) == 2  # [2.9, 1.0, 3.0, 0.5] with 1 and 3 penalised
    assert chain.perf()["n_sample"] == 3


def test_sample_without_a_row_or_without_a_selection_raises():
    chain = SamplerChain([TopK(2)])
    with pytest.raises(ValueError, match="no logits"):
        chain.sample(FakeContext({}), 5)
    with pytest.raises(ValueError, match="no token was selected"):
        chain.sample(FakeContext({-1: np.zeros(4, np.float32)}))
    with pytest.raises(TypeError):
        SamplerChain([object()])


def test_chain_reuses_its_candidates_buffer():
    rng = np.random.default_rng(0)
    chain = SamplerChain([TopK(5), Dist(3)])
    ctx = FakeContext({-1: rng.standard_normal(1000).astype(np.float32)})
    chain.sample(ctx)
    buffer = chain._cur._logits
    for _ in range(3):
        ctx.rows[-1] = rng.standard_normal(1000).astype(np.float32)
        chain.sample(ctx)
    assert chain._cur._logits is buffer


def test_perf_counts_and_no_perf():
    ctx = FakeContext({-1: np.random.default_rng(1).standard_normal(5000).astype(np.float32)})
    timed, untimed = SamplerChain([TopK(40), Dist(1)]), SamplerChain([Dist(1)], no_perf=True)
    for _ in range(3):
        timed.sample(ctx)
        untimed.sample(ctx)
    assert timed.perf()["n_sample"] == 3 and timed.perf()["t_sample_ms"] > 0
    assert untimed.perf() == {"t_sample_ms": 0.0, "n_sample": 3}
    timed.perf_reset()
    assert timed.perf() == {"t_sample_ms": 0.0, "n_sample": 0}
    assert timed.clone().perf()["n_sample"] == 0


def test_reset_and_get_seed():
    chain = SamplerChain([TopK(10), Dist(77)])
    ctx = FakeContext({-1: np.random.default_rng(2).standard_normal(300).astype(np.float32)})
    first = [chain.sample(ctx) for _ in range(5)]
    chain.reset()
    assert [chain.sample(ctx) for _ in range(5)] == first
    assert chain.get_seed() == 77
    assert SamplerChain([TopK(3)]).get_seed() == LLAMA_DEFAULT_SEED
    assert SamplerChain([SamplerChain([Mirostat(10, 5, 5.0, 0.1, 100)])]).get_seed() == 5


def test_common_sampler_builds_llama_cpp_default_chain():
    chain = common_sampler()
    assert [s.name for s in chain.samplers] == [
        "penalties", "dry", "top-n-sigma", "top-k", "typical", "top-p", "min-p", "xtc",
        "temp-ext", "dist"]
    top_k, top_p, min_p = chain.samplers[3], chain.samplers[5], chain.samplers[6]
    assert (top_k.k, top_p.p, min_p.p) == (40, np.float32(0.95), np.float32(0.05))
    assert chain.samplers[-1].seed == LLAMA_DEFAULT_SEED
    biased = common_sampler(SamplingParams(logit_bias={3: -np.inf}), n_vocab=10)
    assert biased.samplers[0].name == "logit-bias"
    mirostat = common_sampler(SamplingParams(mirostat=1), n_vocab=50)
    assert [s.name for s in mirostat.samplers] == ["temp", "mirostat"]
    assert mirostat.samplers[1].m == 100
    assert [s.name for s in common_sampler(SamplingParams(mirostat=2)).samplers] == [
        "temp", "mirostat-v2"]
    custom = common_sampler(SamplingParams(samplers=("top_k", "temperature")))
    assert [s.name for s in custom.samplers] == ["top-k", "temp-ext", "dist"]


def test_common_sampler_rejects_bad_parameters():
    with pytest.raises(ValueError, match="mirostat"):
        common_sampler(SamplingParams(mirostat=3))
    with pytest.raises(ValueError, match="vocabulary size"):
        common_sampler(SamplingParams(mirostat=1))
    with pytest.raises(ValueError, match="unknown sampler"):
        common_sampler(SamplingParams(samplers=("top_k", "nucleus?")))
    with pytest.raises(ValueError, match="vocab"):
        common_sampler(SamplingParams(dry_multiplier=0.8))
    assert DEFAULT_SAMPLERS[0] == "penalties"


def test_zero_temperature_chain_is_greedy():
    rng = np.random.default_rng(4)
    chain = common_sampler(SamplingParams(temp=0.0, seed=9))
    for _ in range(5):
        row = rng.standard_normal(3000).astype(np.float32)
        assert chain.sample(FakeContext({-1: row})) == int(np.argmax(row))


# --- the candidates array -------------------------------------------------------------------

def test_candidates_from_logits_and_lazy_ids():
    row = np.array([1.0, 5.0, 2.0], dtype=np.float64)
    cur_p = TokenDataArray.from_logits(row)
    assert cur_p.logits.dtype == np.float32 and cur_p.size == 3 and cur_p.selected == -1
    np.testing.assert_array_equal(cur_p.ids, [0, 1, 2])
    np.testing.assert_array_equal(cur_p.p, [0, 0, 0])
    cur_p.load_logits(np.array([9.0, 8.0], dtype=np.float32))
    TopK(1).apply(cur_p)
    np.testing.assert_array_equal(cur_p.ids, [0])
    assert cur_p.p[0] == 0.0


def test_candidates_reject_bad_input():
    with pytest.raises(ValueError, match="one-dimensional"):
        TokenDataArray.from_logits(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="differ in length"):
        TokenDataArray([0, 1], [0.0])
    with pytest.raises(TypeError, match="integers"):
        TokenDataArray([0.5], [0.0])
    with pytest.raises(ValueError, match="int32"):
        TokenDataArray([2**40], [0.0])
    cur_p = TokenDataArray.from_logits(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="shrink"):
        cur_p.size = 5
    cur_p.size = 2
    assert cur_p.size == 2 and len(cur_p.ids) == 2
    with pytest.raises(ValueError, match="no candidate selected"):
        cur_p.selected_id  # noqa: B018


def test_xtc_moves_the_window_like_llama_cpp_moves_its_pointer():
    cur_p = TokenDataArray.from_logits(np.log(np.array([0.4, 0.3, 0.2, 0.1], np.float32)))
    XTC(1.0, 0.15, 1, 0).apply(cur_p)
    np.testing.assert_array_equal(cur_p.ids, [2, 3])
    Greedy().apply(cur_p)
    assert cur_p.selected_id == 2


@pytest.mark.parametrize("make, error", [
    (lambda: TopK("3"), TypeError),
    (lambda: TopK(2.5), TypeError),
    (lambda: TopP(None), TypeError),
    (lambda: TopP("0.5"), TypeError),
    (lambda: MinP(0.1, -1), ValueError),
    (lambda: Dist(2**32), ValueError),
    (lambda: Dist(-5), ValueError),
    (lambda: Temp([1.0]), TypeError),
    (lambda: Mirostat(0, 1, 5.0, 0.1, 100), ValueError),
    (lambda: LogitBias(10, [(1,)]), ValueError),
    (lambda: DRY(None, 1.0, 1.75, 2, 10, ["\n"]), ValueError),
])
def test_bad_arguments_raise_clear_errors(make, error):
    with pytest.raises(error):
        make()


# --- DRY's string sequence breakers -------------------------------------------------------

class ToyVocab:
    """A vocabulary of whole words; tokenize splits on the known words, longest first."""

    def __init__(self, words: list[str]) -> None:
        self.words = words
        self.n_tokens = len(words)

    def detokenize(self, ids, remove_special=False, unparse_special=False) -> str:
        return "".join(self.words[i] for i in ids)

    def tokenize(self, text: str, add_special=False, parse_special=False) -> list[int]:
        out = []
        while text:
            best = max((w for w in self.words if w and text.startswith(w)), key=len)
            out.append(self.words.index(best))
            text = text[len(best):]
        return out


def test_dry_breakers_from_strings():
    vocab = ToyVocab(["a", "b", "\n", "x:", ":y", "ab", "y", "c"])
    dry = DRY(vocab, 1.0, 2.0, 2, 20, ["\n", ":y"])
    # "\n" sits in token 2; ":y" in token 4; token 3 ends with ":" and continues with "y" (6)
    assert dry._breakers == {2: [()], 4: [()], 3: [(6,)]}
    for token in [0, 1, 0, 1, 0]:  # a b a b a: "b" would make "a b a" repeat for a 4th token
        dry.accept(token)
    cur_p = TokenDataArray.from_logits(np.zeros(8, np.float32))
    dry.apply(cur_p)
    assert cur_p.logits[1] == -2.0 and np.count_nonzero(cur_p.logits) == 1
    # a breaker in the context stops repeats from reaching past it
    for token in [2, 0]:
        dry.accept(token)
    cur_p = TokenDataArray.from_logits(np.zeros(8, np.float32))
    dry.apply(cur_p)
    assert not cur_p.logits.any()


def test_dry_breakers_match_llama_cpp_on_a_real_vocab(smollm_path):
    """Our breaker processing through llama.cpp's own tokenizer = llama.cpp's DRY."""
    llama_cpp = import_peer()
    import ctypes

    from gguflm.bench.sampling import LlamaCppSamplers

    model = llama_cpp.Llama(str(smollm_path), vocab_only=True, verbose=False)
    vocab_ptr = model._model.vocab

    class LlamaCppVocab:
        n_tokens = model.n_vocab()

        def detokenize(self, ids, remove_special=False, unparse_special=False):
            tokens = (llama_cpp.llama_token * len(ids))(*ids)
            buf = ctypes.create_string_buffer(256)
            n = llama_cpp.llama_detokenize(vocab_ptr, tokens, len(ids), buf, 256, remove_special,
                                           unparse_special)
            return buf.raw[:n]

        def tokenize(self, text, add_special=False, parse_special=False):
            return model.tokenize(text.encode(), add_bos=add_special, special=parse_special)

    breakers = ["\n", ":", "\"", "*", "User:"]
    ours = DRY(LlamaCppVocab(), 1.5, 1.75, 2, 64, breakers)
    reference = LlamaCppSamplers()
    c_breakers = (ctypes.c_char_p * len(breakers))(*[b.encode() for b in breakers])
    theirs = reference.init("dry", vocab_ptr, 1.5, 1.75, 2, 64, c_breakers, len(breakers))
    text = "User: tell me\nUser: tell me a story: once upon a time\nUser: tell me a"
    history = model.tokenize(text.encode(), add_bos=False)
    logits = np.random.default_rng(0).standard_normal(model.n_vocab()).astype(np.float32)
    for upto in (len(history) // 2, len(history)):
        ours.reset()
        reference.lib.llama_sampler_reset(theirs)
        for token in history[:upto]:
            ours.accept(token)
            reference.lib.llama_sampler_accept(theirs, token)
        mine = TokenDataArray.from_logits(logits)
        ours.apply(mine)
        candidates = reference.candidates(len(logits))
        candidates.load(logits)
        candidates.apply(theirs)
        np.testing.assert_array_equal(mine.logits, candidates.view()["logit"])
    assert (mine.logits != logits).any()  # " story" would extend " tell me a"
