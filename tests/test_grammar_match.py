"""Matching text against a grammar (``llama_grammar_accept_token`` step by step), against
llama.cpp: its test-grammar-integration.cpp cases (tests/data/grammar/integration.json; the
schema cases through the llama.cpp converter option), and llama.cpp's matcher itself (the oracle)
on random grammars with strings drawn from them, fed in random pieces so that UTF-8 characters
split across tokens are exercised.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gguflm.grammar import Grammar, GrammarError
from _grammar_oracle import CRASHED, oracle, split_pieces, token_text
from grammar_strategies import SHIPPED_GRAMMARS, derive, grammars

DATA = Path(__file__).resolve().parent / "data" / "grammar"
INTEGRATION = json.loads((DATA / "integration.json").read_text())
FUZZ = settings(max_examples=50, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    o = oracle(tmp_path_factory)
    yield o
    o.close()


def feed(grammar: Grammar, pieces: list[tuple[int, bytes]]) -> bool | None:
    """test-grammar-integration.cpp's ``match_string``: accept every piece, then complete?
    None: the grammar met more parse stacks than gguflm allows (llama.cpp goes on, slower and
    slower: the stacks of such grammars multiply with every character)."""
    compiled = grammar.compile(None)
    state = compiled.initial_state()
    try:
        for token, piece in pieces:
            state = compiled.accept_piece(state, token, piece)
    except GrammarError as err:
        return None if "ambiguous" in str(err) else False
    return compiled.can_end(state)


def matches(grammar: Grammar, text: bytes) -> bool:
    return feed(grammar, split_pieces(text))


def _grammar_of(case: dict) -> Grammar:
    if case["kind"] == "grammar":
        return Grammar.from_string(case["source"])
    return Grammar.from_json_schema(case["source"], converter="llama.cpp", strict=False)


@pytest.mark.parametrize("case", INTEGRATION["cases"], ids=lambda c: c["name"])
def test_llama_cpp_integration_cases(case):
    grammar = _grammar_of(case)
    for text in case["passing"]:
        assert matches(grammar, text.encode("latin-1")), text
    for text in case["failing"]:
        assert not matches(grammar, text.encode("latin-1")), text


def test_integration_cases_match_as_llama_cpp(llama):
    # the same strings, and every prefix of them, through llama.cpp's own matcher
    for case in INTEGRATION["cases"]:
        grammar = _grammar_of(case)
        texts = [t.encode("latin-1") for t in case["passing"] + case["failing"]]
        texts += [t[:k] for t in texts for k in range(0, len(t), 3)]
        theirs = llama.match(grammar.text.encode(), texts)
        assert theirs == [matches(grammar, t) for t in texts], case["name"]


def test_tokens_in_text_are_matched_by_id():
    grammar = Grammar.from_string("root ::= <[10]> (!<[11]>)* <[11]>")
    assert matches(grammar, token_text(10) + b"any text" + token_text(12) + token_text(11))
    assert not matches(grammar, token_text(10) + token_text(11) + token_text(11))
    # a token-top stack ignores the piece: token 11 with any text ends the rule
    compiled = grammar.compile(None)
    state = compiled.accept_piece(compiled.initial_state(), 10, b"<x>")
    assert compiled.can_end(compiled.accept_piece(state, 11, b"anything"))


def test_a_character_split_across_pieces_is_carried_over():
    grammar = Grammar.from_string('root ::= "é" [😀-🙏] "!"')
    compiled = grammar.compile(None)
    text = "é😂!".encode()
    for cut in range(1, len(text)):
        state = compiled.initial_state()
        state = compiled.accept_piece(state, 0, text[:cut])
        if cut in (1, 3, 4, 5):   # inside a character: the unfinished bytes wait
            assert state.partial_remain > 0
        state = compiled.accept_piece(state, 0, text[cut:])
        assert compiled.can_end(state) and state.partial_remain == 0
    with pytest.raises(GrammarError, match="empty grammar stack"):
        compiled.accept_piece(compiled.initial_state(), 0, "e".encode())


def test_state_is_three_ints_and_clones_are_free():
    compiled = Grammar.from_string('root ::= "ab" | "ac"').compile(None)
    s0 = compiled.initial_state()
    s1 = compiled.accept_piece(s0, 0, b"a")
    assert compiled.accept_piece(s0, 0, b"a") == s1        # interned: the same state id
    assert compiled.can_end(compiled.accept_piece(s1, 0, b"c"))
    assert compiled.can_end(compiled.accept_piece(s1, 0, b"b"))   # s1 untouched
    assert not compiled.can_end(s1)


def _pieces(text: bytes, rng: random.Random) -> list[tuple[int, bytes]]:
    """``text`` cut at random byte positions (tokens kept whole)."""
    out: list[tuple[int, bytes]] = []
    for token, piece in split_pieces(text):
        if token or (out and out[-1][0]):
            out.append((token, piece))
        elif out and rng.random() < 0.6:
            out[-1] = (0, out[-1][1] + piece)
        else:
            out.append((0, piece))
    cut: list[tuple[int, bytes]] = []
    for token, piece in out:
        if token or len(piece) < 2 or rng.random() < 0.5:
            cut.append((token, piece))
        else:
            k = rng.randint(1, len(piece) - 1)
            cut += [(0, piece[:k]), (0, piece[k:])]
    return cut


@FUZZ
@given(text=st.sampled_from(SHIPPED_GRAMMARS) | grammars(), seed=st.integers(0, 2**32 - 1))
def test_random_strings_match_as_llama_cpp(llama, text, seed):
    try:
        grammar = Grammar.from_string(text)
    except GrammarError:
        assume(False)
    try:
        grammar.compile(None)
    except GrammarError as err:
        # more parse stacks than gguflm allows from the start (root ::= ("a"*) root: a rule that
        # may be empty before the recursion, which llama.cpp's check does not see either, and
        # whose stacks llama.cpp's initialisation expands without end): no match to compare
        assume("ambiguous" not in str(err))
        raise
    rng = random.Random(seed)
    root = grammar.parsed.symbol_ids["root"]
    samples = [s for s in (derive(grammar.parsed, root, rng) for _ in range(12)) if s is not None]
    texts = samples + [s[:rng.randint(0, len(s))] for s in samples]
    texts += [bytes(rng.choice(b'ab{}[]"01 x\n\xc3\xa9') for _ in range(rng.randint(0, 8)))
              for _ in range(6)]
    inputs = [_pieces(t, rng) for t in texts]
    mine = [feed(grammar, pieces) for pieces in inputs]
    # where gguflm met too many stacks, llama.cpp's stacks multiply until time or memory runs out
    inputs = [p for p, m in zip(inputs, mine) if m is not None]
    mine = [m for m in mine if m is not None]
    theirs = llama.match_pieces(grammar.text.encode(), inputs)
    assert theirs is not None and theirs != CRASHED
    assert theirs == mine


@settings(max_examples=100, deadline=None)
@given(text=st.sampled_from(SHIPPED_GRAMMARS) | grammars(),
       pieces=st.lists(st.tuples(st.integers(0, 50), st.binary(max_size=8)), max_size=12))
def test_random_pieces_only_ever_raise_grammar_error(text, pieces):
    try:
        compiled = Grammar.from_string(text).compile(None)
    except GrammarError:
        return
    state = compiled.initial_state()
    for token, piece in pieces:
        try:
            state = compiled.accept_piece(state, token, piece)
        except GrammarError:
            state = compiled.initial_state()
    compiled.can_end(state)


@pytest.mark.parametrize("text", [
    # exponentially many parses of the same prefix: stacks are bounded, the error is clear
    "root ::= a a a a a a a a a a a a a a a a a a a a\na ::= | b b\nb ::= | c c\n"
    "c ::= | d d\nd ::= | e e\ne ::= | \"x\"",
])
def test_ambiguous_grammar_is_refused_not_hung(text):
    grammar = Grammar.from_string(text)
    with pytest.raises(GrammarError, match="ambiguous|stacks"):
        compiled = grammar.compile(None)
        state = compiled.initial_state()
        for _ in range(40):
            state = compiled.accept_piece(state, 0, b"x")
