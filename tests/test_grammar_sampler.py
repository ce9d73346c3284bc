"""Whole-vocabulary masks against llama.cpp's grammar sampler (``llama_sampler_init_grammar``
through llama-cpp-python), on real vocabularies: the two real models and some of llama.cpp's
tokenizer-test vocabularies. Random walks through each grammar compare the mask before every
token; the walks prefer tokens that end inside a UTF-8 character, so that partial characters carried
across tokens are compared too. Also: candidate subsets, lazy grammars and their triggers, and
llama.cpp's common-sampler flow (sample, check one token, resample on rejection).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

import gguflm
from gguflm.grammar import Grammar, GrammarChain, GrammarError, GrammarSampler
from gguflm.grammar.builtin import JSON_GBNF
from gguflm.sampling import SamplerChain, SamplingParams, common_sampler
from gguflm.samplers import Dist, TokenDataArray
from _grammar_oracle import LlamaCppGrammarSampler
from _llama import require_llama

VOCABS = Path(__file__).resolve().parent / "data" / "vocab"

GRAMMARS = {
    "json": JSON_GBNF,
    "json-schema": Grammar.from_json_schema(
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                          "tags": {"type": "array", "items": {"enum": ["a", "é"]}},
                                          "n": {"type": "integer", "minimum": -3, "maximum": 250}},
         "required": ["name"]}).text,
    "unicode": 'root ::= ([ぁ-ゖ] | [😀-🙏] | "é" | [^\\x00-\\x7F])+ "."',
    "any": "root ::= .{1,6} [\\n]",
    "list": 'root ::= ("- " [^\\n]+ "\\n"){1,3}',
    "tokens": "root ::= <[2]> (!<[3]>)* <[3]>",
}


def _vocab_files():
    return [VOCABS / f"ggml-vocab-{name}.gguf" for name in ("llama-spm", "gpt-2", "qwen35")]


@pytest.fixture(scope="module", params=["gemma", "smollm", *[p.name for p in _vocab_files()]])
def vocab_path(request, gemma_path, smollm_path):
    require_llama()
    return {"gemma": gemma_path, "smollm": smollm_path}.get(request.param,
                                                            VOCABS / request.param)


@pytest.fixture(scope="module")
def vocab(vocab_path):
    with gguflm.Model.load(vocab_path, vocab_only=True) as model:
        yield model.vocab


def _partial_tokens(vocab) -> np.ndarray:
    """Tokens whose piece ends inside a UTF-8 character."""
    out = []
    for t in range(vocab.n_tokens):
        piece = vocab.token_to_piece(t, 0, True)
        if piece:
            try:
                piece.decode("utf-8")
            except UnicodeDecodeError as err:
                if err.reason == "unexpected end of data":
                    out.append(t)
    return np.array(out, dtype=np.int64)


def _walk(vocab, vocab_path, text, steps, seed, partial):
    compiled = Grammar(text).compile(vocab)
    ref = LlamaCppGrammarSampler(vocab_path, text)
    rng = random.Random(seed)
    state = compiled.initial_state()
    try:
        for step in range(steps):
            theirs = ref.mask()
            ours = compiled.mask(state)
            if not np.array_equal(ours, theirs):
                diff = np.flatnonzero(ours != theirs)[:5]
                pytest.fail(f"step {step}: masks differ at {[(int(t), vocab.token_to_piece(int(t), 0, True), bool(ours[t])) for t in diff]}")
            allowed = np.flatnonzero(theirs)
            choices = [t for t in allowed.tolist() if t not in vocab.eog_ids]
            if not choices:
                return
            partials = np.intersect1d(allowed, partial)
            token = int(rng.choice(partials)) if len(partials) and rng.random() < 0.4 \
                else rng.choice(choices)
            ref.accept(token)
            state = compiled.accept(state, token)
    finally:
        ref.close()


@pytest.mark.parametrize("name", GRAMMARS)
def test_masks_equal_llama_cpp_along_random_walks(vocab, vocab_path, name):
    partial = _partial_tokens(vocab)
    for seed in range(2):
        _walk(vocab, vocab_path, GRAMMARS[name], steps=10, seed=seed, partial=partial)


def test_candidate_subsets_equal_the_full_mask(vocab):
    compiled = Grammar(JSON_GBNF).compile(vocab)
    rng = np.random.default_rng(0)
    state = compiled.initial_state()
    for _ in range(8):
        full = compiled.mask(state)
        ids = rng.choice(vocab.n_tokens, size=300, replace=False).astype(np.int32)
        ids = np.concatenate([ids, np.flatnonzero(full)[:20].astype(np.int32)])
        for full_mask_from in (10**9, 0):   # checked one by one, then through the mask
            logits = np.zeros(len(ids), dtype=np.float32)
            compiled.apply(state, ids, logits, full_mask_from)
            assert np.array_equal(np.isfinite(logits), full[ids])
        allowed = [t for t in np.flatnonzero(full).tolist() if t not in vocab.eog_ids]
        if not allowed:   # complete: only end-of-generation tokens remain
            break
        state = compiled.accept(state, allowed[rng.integers(len(allowed))])


def test_lazy_grammar_waits_for_its_trigger(vocab, vocab_path):
    # the grammar takes the text from the trigger (the first capture group) on
    grammar = 'root ::= "CALL{" [a-z]* "}"'
    word = "CALL"
    text = f"hello {word}{{abc}}"
    tokens = vocab.tokenize(text, add_special=False)
    # the C API's patterns; llama_sampler_init_grammar_lazy's words become this one pattern
    pattern = "[\\s\\S]*?(" + word + ")[\\s\\S]*"
    ours = GrammarSampler(vocab, grammar, lazy=True, trigger_words=[word])
    assert ours.trigger_patterns[0].pattern == pattern
    ref = LlamaCppGrammarSampler(vocab_path, grammar, lazy=True, patterns=(pattern,))
    try:
        for token in tokens:
            cur = TokenDataArray.from_logits(np.zeros(vocab.n_tokens, dtype=np.float32))
            ours.apply(cur)
            assert np.array_equal(np.isfinite(cur.logits), ref.mask())
            ref.accept(token)
            try:
                ours.accept(token)
            except GrammarError:
                pytest.fail("the replayed trigger text did not fit the grammar")
    finally:
        ref.close()


def test_lazy_grammar_triggered_by_a_token(vocab, vocab_path):
    # the trigger token is the grammar's first token
    trigger = vocab.tokenize("x", add_special=False)[0]
    grammar = f'root ::= <[{trigger}]> [0-9]+'

    ours = GrammarSampler(vocab, grammar, lazy=True, trigger_tokens=[trigger])
    ref = LlamaCppGrammarSampler(vocab_path, grammar, lazy=True, tokens=(trigger,))
    try:
        assert ours.awaiting_trigger and ref.mask().all()
        ours.accept(trigger)
        ref.accept(trigger)
        assert not ours.awaiting_trigger
        cur = TokenDataArray.from_logits(np.zeros(vocab.n_tokens, dtype=np.float32))
        ours.apply(cur)
        assert np.array_equal(np.isfinite(cur.logits), ref.mask())
    finally:
        ref.close()


def test_clone_and_reset(vocab):
    sampler = GrammarSampler(vocab, 'root ::= " "? "ab" "c"?')  # SPM adds a leading space
    for token in vocab.tokenize("ab", add_special=False):
        sampler.accept(token)
    twin = sampler.clone()
    assert twin.state == sampler.state and twin.can_end()
    sampler.reset()
    assert not sampler.can_end() and twin.can_end()
    with pytest.raises(GrammarError):
        sampler.accept(vocab.tokenize("zz", add_special=False)[0])


class _Row:
    def __init__(self, row):
        self.row = row

    def get_logits_ith(self, idx):
        return self.row


def test_common_sampler_flow_matches_llama_cpp(vocab, vocab_path):
    """llama.cpp's common_sampler_sample, written out with its C samplers, against
    GrammarChain: the same tokens, and a full mask only after a rejection."""
    from gguflm.bench.sampling import LlamaCppSamplers

    text = 'root ::= [a-z ]{3,20} "."'
    params = SamplingParams(seed=7, top_k=50, temp=1.5)
    ours = common_sampler(SamplingParams(seed=7, top_k=50, temp=1.5, grammar=text), vocab=vocab)
    assert isinstance(ours, GrammarChain)
    lib = LlamaCppSamplers()
    chain = lib.common_chain(params, vocab.n_tokens)
    grammar = LlamaCppGrammarSampler(vocab_path, text)
    cur = lib.candidates(vocab.n_tokens)
    rng = np.random.default_rng(1)
    rejected = 0
    try:
        for _ in range(12):
            row = (rng.standard_normal(vocab.n_tokens) * 4).astype(np.float32)
            cur.load(row)
            cur.apply(chain)
            token = cur.selected_id()
            if not grammar.mask([token])[0]:
                rejected += 1
                cur.load(row)
                allowed = grammar.mask()
                cur.buffer["logit"][~allowed] = -np.inf
                cur.apply(chain)
                token = cur.selected_id()
            grammar.accept(token)
            lib.lib.llama_sampler_accept(chain, token)
            assert ours.sample(_Row(row), -1) == token
            if ours.grammar.can_end():
                break
        assert ours.n_rejected == rejected > 0
    finally:
        grammar.close()


def test_grammar_first_and_sample_first_agree_when_greedy(vocab):
    text = 'root ::= "The " [a-z]+ " is " [0-9]{1,3} "."'
    first = SamplerChain([GrammarSampler(vocab, text), *common_sampler(
        SamplingParams(temp=0.0, seed=3), vocab=vocab).samplers])
    second = common_sampler(SamplingParams(temp=0.0, seed=3, grammar=text), vocab=vocab)
    rng = np.random.default_rng(2)
    for _ in range(10):
        row = _Row((rng.standard_normal(vocab.n_tokens) * 3).astype(np.float32))
        assert first.sample(row, -1) == second.sample(row, -1)


def test_samplers_module_exports_the_grammar_sampler():
    assert gguflm.samplers.Grammar is GrammarSampler
    assert isinstance(Dist(1), gguflm.samplers.Sampler)


def test_named_tokens_resolve_through_the_vocabulary(vocab, vocab_path):
    # a control token written <name> in the grammar, as llama.cpp resolves it (tokenized with
    # special tokens parsed: exactly one token)
    controls = sorted((t for t in range(vocab.n_tokens) if vocab.is_control(t)),
                      key=lambda t: t in vocab.eog_ids)   # end-of-generation ones last
    names = [n for n in (vocab.token_text(t) for t in controls)
             if n.startswith("<") and n.endswith(">") and ">" not in n[:-1]
             and len(vocab.tokenize(n, add_special=False, parse_special=True)) == 1][:1]
    assert names, "every vocabulary here has a control token <...>"
    text = f'root ::= {names[0]} "x" | "y"'
    compiled = Grammar(text).compile(vocab)
    token = vocab.tokenize(names[0], add_special=False, parse_special=True)[0]
    ref = LlamaCppGrammarSampler(vocab_path, text)
    try:
        mask = compiled.mask(compiled.initial_state())
        # an end-of-generation token is allowed only where the grammar may end, even as <name>
        assert mask[token] == (token not in vocab.eog_ids)
        assert np.array_equal(mask, ref.mask())
    finally:
        ref.close()
    with pytest.raises(GrammarError, match="needs a vocabulary"):
        Grammar(text).compile(None)


def test_left_recursion_behind_a_group_is_refused_at_start_not_hung(vocab):
    # llama.cpp's detector sees only rules with an empty alternative of their own as empty, so it
    # misses `root` reaching itself through a group around a star; starting such a grammar has no
    # end of parse stacks: it must stop with a clear error
    grammar = Grammar.from_string('root ::= ((("a")*) root "a")\n')
    with pytest.raises(GrammarError, match="too ambiguous"):
        GrammarSampler(vocab, grammar)
