"""The GBNF parser against llama.cpp's: its own parser tests (tests/data/grammar/parser.json and
integration.json, extracted from llama.cpp's test sources), the grammars llama.cpp and
llama-cpp-python ship, and random and mutated grammars through llama.cpp's parser itself (the
oracle tests/llama_grammar_oracle.cpp, built against llama-cpp-python's libllama.so).

"Same" means the same symbol table (names and ids, generated ``name_N`` rules included) and the
same elements in every rule, or both rejecting. Where llama.cpp crashes or loops (``{m,n}`` with
n < m), gguflm must raise :class:`GrammarError` instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguflm.grammar import Grammar, GrammarError
from gguflm.grammar.builtin import JSON_GBNF
from gguflm.grammar.gbnf import (ALT, CHAR, END, MAX_NESTING, RULE_REF, TOKEN, TOKEN_NOT,
                                 check_left_recursion, parse)
from _grammar_oracle import CRASHED, oracle
from grammar_strategies import SHIPPED_GRAMMARS, grammars, mutated

DATA = Path(__file__).resolve().parent / "data" / "grammar"
PARSER = json.loads((DATA / "parser.json").read_text())
INTEGRATION = json.loads((DATA / "integration.json").read_text())
FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    o = oracle(tmp_path_factory)
    yield o
    o.close()


def ours(text: str | bytes):
    """Our parse as the oracle reports llama.cpp's: (symbols, rules) or an error string."""
    try:
        parsed = parse(text)
    except GrammarError as err:
        return f"error: {err}"
    if not parsed.rules:   # llama.cpp's parser succeeds, llama_grammar_init fails
        return "error: no rules"
    return parsed.symbol_ids, [list(r) for r in parsed.rules]


def same(theirs, mine) -> bool:
    if isinstance(theirs, str) or isinstance(mine, str):
        return isinstance(theirs, str) and isinstance(mine, str)
    return theirs[0] == mine[0] and theirs[1] == mine[1]


# -- llama.cpp's test-grammar-parser.cpp, ported


@pytest.mark.parametrize("case", PARSER["parses"], ids=lambda c: c["grammar"].strip()[:40])
def test_parses_as_llama_cpp_test_expects(case):
    parsed = parse(case["grammar"])
    assert parsed.symbol_ids == case["symbols"]
    flat = [list(e) for rule in parsed.rules for e in rule]
    # one of llama.cpp's expectations (root ::= "a"+) lists fewer elements than its parser makes
    # (its test reads past the list); the elements listed must be ours, in order
    assert flat[:len(case["elements"])] == case["elements"]
    if case["grammar"].strip() != 'root  ::= "a"+':
        assert len(flat) == len(case["elements"])


@pytest.mark.parametrize("grammar", PARSER["failures"], ids=lambda g: g.strip()[:40])
def test_rejects_what_llama_cpp_test_rejects(grammar):
    with pytest.raises(GrammarError):
        parse(grammar)


@pytest.mark.parametrize("grammar", INTEGRATION["build_failures"], ids=lambda g: g.strip()[:40])
def test_left_recursion_is_rejected(grammar):
    check = parse(grammar)
    with pytest.raises(GrammarError, match="left recursion"):
        check_left_recursion(check)
    with pytest.raises(GrammarError, match="left recursion"):
        Grammar.from_string(grammar)


def test_missing_root_and_custom_root():
    # test-grammar-integration.cpp: test_failure_missing_root, ..._root_symbol, custom root check
    no_root = 'rot ::= expr\nexpr ::= term ("+" term)*\nterm ::= number\nnumber ::= [0-9]+'
    assert parse(no_root).rules
    with pytest.raises(GrammarError, match="'root' symbol"):
        Grammar.from_string(no_root)
    with pytest.raises(GrammarError, match="'nonexistent' symbol"):
        Grammar.from_string('root ::= "foobar"', root="nonexistent")
    with pytest.raises(GrammarError, match="'root' symbol"):
        Grammar.from_string('foobar ::= "foobar"')
    assert Grammar.from_string('foobar ::= "foobar"', root="foobar").root == "foobar"


def test_missing_reference_names_the_rule_and_where_it_is_used():
    text = 'root ::= expr\nexpr ::= term ("+" term)*\nterm ::= numero\nnumber ::= [0-9]+'
    with pytest.raises(GrammarError, match="numero") as info:
        parse(text)
    assert (info.value.line, info.value.column) == (3, 10)


def test_token_references():
    parsed = parse("root ::= <[1000]> !<[1001]> <[1001]>")
    assert parsed.rules[0] == [(TOKEN, 1000), (TOKEN_NOT, 1001), (TOKEN, 1001), (END, 0)]
    with pytest.raises(GrammarError, match="no vocab"):
        parse("root ::= <think>")
    assert parse("root ::= <think>", tokenize=lambda text: [7]).rules[0] == [(TOKEN, 7), (END, 0)]
    with pytest.raises(GrammarError, match="invalid token"):
        parse("root ::= <think>", tokenize=lambda text: [7, 8])


@pytest.mark.parametrize("text, line, column", [
    ('root ::= "a"\nfoo ::= [b-', 2, 12),            # unexpected end of input
    ('root ::= "\\q"', 1, 11),                        # unknown escape
    ('root ::= "\\x4"', 1, 13),                       # expecting 2 hex chars
    ('root ::= x\n\n  y := "a"', 3, 5),               # expecting ::=
    ('root ::= ("a" | "b"', 1, 20),                   # expecting ')'
    ('root ::= "é" ( "a" ]', 1, 20),                  # column counts characters, not bytes
])
def test_errors_carry_line_and_column(text, line, column):
    with pytest.raises(GrammarError) as info:
        parse(text)
    assert (info.value.line, info.value.column) == (line, column), str(info.value)


def test_where_llama_cpp_would_loop_or_overflow_we_refuse():
    # llama.cpp computes n - m unsigned and generates rules until memory runs out
    for text in ('root ::= "a"{5,3}', 'root ::= [ab]{3,0}'):
        with pytest.raises(GrammarError, match="below the minimum"):
            parse(text)
    deep = "root ::= " + "(" * (MAX_NESTING + 1) + '"a"' + ")" * (MAX_NESTING + 1)
    with pytest.raises(GrammarError, match="nested deeper"):
        parse(deep)
    huge = 'root ::= "' + "a" * 5000 + '"{2000}'
    with pytest.raises(GrammarError, match="too large"):
        parse(huge)


def test_deep_left_recursion_chain_does_not_overflow_the_stack():
    rules = "\n".join(f"r{i} ::= r{i + 1} \"x\" | \"y\"" for i in range(5000))
    text = "root ::= r0\n" + rules + "\nr5000 ::= r0"
    with pytest.raises(GrammarError, match="left recursion"):
        Grammar.from_string(text)
    fine = "root ::= r0\n" + rules + '\nr5000 ::= "z"'
    assert Grammar.from_string(fine).parsed.rules


# -- side by side with llama.cpp's parser


def test_ported_and_shipped_grammars_parse_as_llama_cpp(llama):
    texts = [c["grammar"] for c in PARSER["parses"]] + PARSER["failures"] + [
        c["source"] for c in INTEGRATION["cases"] if c["kind"] == "grammar"] + SHIPPED_GRAMMARS
    for text in texts:
        theirs = llama.parse(text.encode())
        assert same(theirs, ours(text)), text


def theirs_unless_endless(llama, text: bytes, mine):
    """llama.cpp's parse, not asked where it would allocate without end (we refuse those)."""
    if isinstance(mine, str) and "below the minimum" in mine:
        return CRASHED
    return llama.parse(text)


@FUZZ
@given(text=grammars())
def test_random_grammars_parse_as_llama_cpp(llama, text):
    mine = ours(text)
    theirs = theirs_unless_endless(llama, text.encode(), mine)
    if theirs == CRASHED:
        assert isinstance(mine, str), "llama.cpp died on a grammar gguflm accepts"
    else:
        assert same(theirs, mine), (theirs, mine)


@FUZZ
@given(text=mutated())
def test_mutated_grammars_parse_as_llama_cpp(llama, text):
    mine = ours(text)
    theirs = theirs_unless_endless(llama, text, mine)
    if theirs == CRASHED:
        assert isinstance(mine, str)
    else:
        assert same(theirs, mine), (theirs, mine)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200) | st.text(max_size=120).map(lambda t: t.encode()))
def test_random_bytes_only_ever_raise_grammar_error(data):
    try:
        parsed = parse(data)
        if parsed.rules:
            check_left_recursion(parsed)
    except GrammarError:
        pass


def test_json_grammar_has_llama_cpp_rule_ids():
    parsed = parse(JSON_GBNF)
    assert list(parsed.symbol_ids)[:6] == ["root", "object", "value", "array", "string", "number"]
    assert parsed.rules[0] == [(RULE_REF, 1), (END, 0)]
    assert any(kind == ALT for kind, _ in parsed.rules[2]) and parsed.rules[1][0] == (CHAR, 123)
