"""JSON schema -> GBNF against the two references: llama.cpp's C++ converter through its own test
cases (tests/data/grammar/json_schema_to_grammar.json, extracted from
test-json-schema-to-grammar.cpp), and llama-cpp-python 0.3.36's converter itself (when installed)
on those schemas and on random ones. Every grammar must parse, and the text it admits must be JSON
that the ``jsonschema`` validator accepts (strict mode).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings

from _llama import import_peer
from gguflm.grammar import Grammar, GrammarError, UnsupportedSchemaError
from gguflm.grammar.json_schema import SchemaError, json_schema_to_gbnf
from grammar_strategies import derive, json_schemas

jsonschema = pytest.importorskip("jsonschema")

DATA = Path(__file__).resolve().parent / "data" / "grammar"
CPP_CASES = json.loads((DATA / "json_schema_to_grammar.json").read_text())
SCHEMAS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _trim(text: str) -> str:
    """test-json-schema-to-grammar.cpp's ``trim``: no indentation, no outer blank lines."""
    return re.sub(r"(^|\n)[ \t]+", r"\1", text.strip(" \n\r\t"))


def _reference():
    return import_peer("llama_cpp.llama_grammar").json_schema_to_gbnf


# -- llama.cpp's converter


@pytest.mark.parametrize("case", CPP_CASES, ids=lambda c: c["name"])
def test_llama_cpp_converter_writes_llama_cpp_grammars(case):
    try:
        grammar = json_schema_to_gbnf(case["schema"], converter="llama.cpp", strict=False)
    except SchemaError:
        assert case["status"] == "FAILURE"
        return
    assert case["status"] == "SUCCESS"
    assert _trim(grammar) == _trim(case["grammar"])
    Grammar.from_string(grammar)


@pytest.mark.parametrize("case", [c for c in CPP_CASES if c["status"] == "SUCCESS"],
                         ids=lambda c: c["name"])
def test_strict_llama_cpp_converter_raises_or_writes_the_same(case):
    try:
        grammar = json_schema_to_gbnf(case["schema"], converter="llama.cpp")
    except UnsupportedSchemaError as err:
        assert "strict=False" in str(err) or "not supported" in str(err) \
            or "JSON string" in str(err)
        return
    if "[^" in _trim(case["grammar"]).replace("char ::= [^", ""):
        # strict keeps raw quotes, backslashes and control characters out of a pattern's dot,
        # negated classes and additional property names
        assert "[^\"\\\\\\x00-\\x1F" in grammar
        return
    assert _trim(grammar) == _trim(case["grammar"])


# -- llama-cpp-python's converter


def _same_as_reference(schema: dict, theirs) -> None:
    try:
        expected = theirs(json.dumps(schema))
    except Exception:   # llama-cpp-python asserts, KeyErrors, ... on what it cannot convert
        with pytest.raises(GrammarError):
            json_schema_to_gbnf(schema, strict=False)
        return
    assert json_schema_to_gbnf(schema, strict=False) == expected
    try:
        strict = json_schema_to_gbnf(schema)
    except UnsupportedSchemaError:
        return
    text = json.dumps(schema)
    # strict honours integer bounds llama-cpp-python drops, and writes the comma it forgets
    # before additional properties
    departs = any(k in text for k in ("minimum", "maximum", "exclusiveMinimum",
                                      "exclusiveMaximum", "additionalProperties", "pattern"))
    if not departs:
        assert strict == expected


def test_default_converter_equals_llama_cpp_python_on_llama_cpp_test_schemas():
    theirs = _reference()
    for case in CPP_CASES:
        try:
            schema = json.loads(case["schema"])
        except ValueError:
            continue
        _same_as_reference(schema, theirs)


@SCHEMAS
@given(schema=json_schemas())
def test_default_converter_equals_llama_cpp_python_on_random_schemas(schema):
    _same_as_reference(schema, _reference())


def test_llama_cpp_grammar_shim_matches_llama_cpp_python():
    theirs = import_peer().LlamaGrammar
    import gguflm

    schema = json.dumps({"type": "object", "properties": {"a": {"type": "string"}}})
    assert gguflm.LlamaGrammar.from_json_schema(schema).text == \
        theirs.from_json_schema(schema, verbose=False)._grammar
    assert gguflm.LlamaGrammar.from_string("root ::= [a]")._grammar == "root ::= [a]"


# -- strictness


@pytest.mark.parametrize("converter", ["llama-cpp-python", "llama.cpp"])
@pytest.mark.parametrize("schema, keyword", [
    ({"type": "number", "minimum": 0}, "minimum"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "string", "format": "email"}, "format"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength"),
    ({"type": "object", "properties": {"a": {}}, "minProperties": 1}, "minProperties"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "integer", "multipleOf": 3}, "multipleOf"),
])
def test_unsupported_keywords_raise_clearly(converter, schema, keyword):
    with pytest.raises(UnsupportedSchemaError, match=keyword):
        json_schema_to_gbnf(schema, converter=converter)
    try:
        json_schema_to_gbnf(schema, converter=converter, strict=False)   # the reference drops it
    except SchemaError:   # ... or, llama-cpp-python's, fails on a schema without a type
        assert converter == "llama-cpp-python" and "type" not in schema


def test_keywords_of_other_types_and_annotations_are_not_errors():
    for converter in ("llama-cpp-python", "llama.cpp"):
        json_schema_to_gbnf({"type": "string", "minimum": 3, "title": "t", "examples": ["x"]},
                            converter=converter)
        json_schema_to_gbnf({"type": "array", "items": {"type": "integer"}, "uniqueItems": False},
                            converter=converter)


def test_malformed_schemas_raise_schema_errors():
    for bad in ("not json", "[1, 2]", {"$ref": "#/nowhere"}, {"type": "array", "minItems": -1},
                {"$ref": "https://example.com/s.json"}):
        for converter in ("llama-cpp-python", "llama.cpp"):
            with pytest.raises(SchemaError):
                json_schema_to_gbnf(bad, converter=converter)


def test_deep_schemas_are_refused_not_overflowed():
    schema: dict = {"type": "string"}
    for _ in range(5000):
        schema = {"type": "array", "items": schema}
    for converter in ("llama-cpp-python", "llama.cpp"):
        with pytest.raises(UnsupportedSchemaError, match="deep"):
            json_schema_to_gbnf(schema, converter=converter)


# -- what the grammars admit


def _one_of_as_any_of(schema):
    """Both converters read oneOf as anyOf: a grammar cannot see that alternatives overlap."""
    if isinstance(schema, dict):
        return {("anyOf" if k == "oneOf" else k): _one_of_as_any_of(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_one_of_as_any_of(v) for v in schema]
    return schema


def _admitted(grammar: Grammar, rng: random.Random, n: int) -> list[bytes]:
    root = grammar.parsed.symbol_ids["root"]
    return [s for s in (derive(grammar.parsed, root, rng, budget=120) for _ in range(n))
            if s is not None]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=json_schemas())
def test_text_the_grammar_admits_is_valid_json_for_the_schema(schema):
    rng = random.Random(json.dumps(schema, sort_keys=True))
    for converter in ("llama-cpp-python", "llama.cpp"):
        try:
            grammar = Grammar.from_json_schema(schema, converter=converter)
        except UnsupportedSchemaError:
            continue
        for text in _admitted(grammar, rng, 8):
            # llama-cpp-python's string rule admits raw control characters, which only
            # non-strict JSON parsing accepts
            value = json.loads(text, strict=converter == "llama.cpp")
            jsonschema.validate(value, _one_of_as_any_of(schema))


@settings(max_examples=60, deadline=None)
@given(schema=json_schemas())
def test_grammars_parse_and_build(schema):
    for converter in ("llama-cpp-python", "llama.cpp"):
        try:
            text = json_schema_to_gbnf(schema, converter=converter)
        except UnsupportedSchemaError:
            continue
        Grammar.from_string(text).compile(None).initial_state()


@pytest.mark.parametrize("low, high", [(0, None), (-5, None), (None, 30), (None, -7), (-123, 42),
                                       (15, 300), (1000, 1000), (-20, -3), (100, None),
                                       (207, None), (-1005, None), (None, -207), (105, 1100)])
def test_integer_bounds_admit_exactly_the_range(low, high):
    schema = {"type": "integer"}
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    for converter in ("llama-cpp-python", "llama.cpp"):
        compiled = Grammar.from_json_schema(schema, converter=converter).compile(None)
        for value in range(-400, 1200, 7):
            text = str(value).encode()
            try:
                state = compiled.accept_piece(compiled.initial_state(), 0, text)
                admitted = compiled.can_end(state)
            except GrammarError:
                admitted = False
            inside = (low is None or value >= low) and (high is None or value <= high)
            assert admitted == inside, (converter, value)


def test_non_strict_keeps_llama_cpp_digit_rules_even_where_they_are_loose():
    schema = {"type": "integer", "minimum": 207}
    loose = Grammar.from_json_schema(schema, converter="llama.cpp", strict=False).compile(None)
    exact = Grammar.from_json_schema(schema, converter="llama.cpp").compile(None)
    assert loose.can_end(loose.accept_piece(loose.initial_state(), 0, b"27"))   # 27 < 207
    assert not exact.can_end(exact.accept_piece(exact.initial_state(), 0, b"27"))
