"""JSON schema -> GBNF, as the two reference converters write it.

``converter="llama-cpp-python"`` (the default) writes the grammar llama-cpp-python 0.3.36's
``LlamaGrammar.from_json_schema`` writes (its ``llama_grammar.json_schema_to_gbnf``): every value
followed by ``space ::= " "?``, properties in schema order (or ``prop_order``), rule names and
their order identical, so constrained outputs equal llama-cpp-python's.
``converter="llama.cpp"`` writes what llama.cpp's ``json_schema_to_grammar`` writes
(``common/json-schema-to-grammar.cpp`` and ``common/json-schema.cpp``: space, newlines and
indentation between tokens, none after a value).

Supported: ``type`` (one or a list), ``properties``/``required``/``additionalProperties``,
``enum``/``const``, ``items`` (schema or tuple)/``prefixItems``/``minItems``/``maxItems``,
``minLength``/``maxLength``, ``pattern`` (``^...$`` regular expressions without lookaround),
``format`` date, time, date-time, uuid, integer ``minimum``/``maximum``/``exclusiveMinimum``/
``exclusiveMaximum``, ``$ref`` into the same document with ``$defs``/``definitions``,
``anyOf``/``oneOf`` (as anyOf), ``allOf`` of objects. Annotations (``title``, ``description``,
``default``, ``examples``, ...) are ignored.

Integer bounds: llama.cpp's digit rules lose the length of a minimum's tail when it starts with a
0 (a minimum of 207 admits 27 and 200; of 100, 10). With ``strict=True`` those bounds get our own
exact rules instead (same digit limit); ``strict=False`` keeps llama.cpp's.

Patterns: a pattern's ``.`` and negated classes admit a raw quote, backslash or control character,
which inside a JSON string ends it or makes it invalid. With ``strict=True`` they leave those out
(so ``^a.c$`` still admits ``"abc"`` but never ``"a"c"``), and a positive class or literal text
holding one raises; ``strict=False`` writes the references' rules.

Strictness. Both reference converters drop keywords they cannot express without a word (number
bounds, ``uniqueItems``, unknown formats, a pattern next to a length, ...), so their grammars may
produce values the schema rejects. With ``strict=True`` (the default) such a keyword raises
:class:`UnsupportedSchemaError` naming it and where it is; ``strict=False`` drops it as the
reference does, and then the grammar is the reference's exactly.

Where the llama-cpp-python converter departs from llama-cpp-python's output (``strict=True`` only):
integer bounds are honoured (with llama.cpp's digit rules, then `` space``) instead of dropped; a
schema holding only annotations means any JSON value (llama-cpp-python fails on it); additional
properties after an optional property get their comma (llama-cpp-python's grammar omits it, so
``{"a": 1 "b": 2}`` would be admitted), and additional keys exclude the declared property names
(as llama.cpp's converter excludes them). Where llama-cpp-python's grammar would admit other text
than the schema means and no such fix is known, strict raises instead: JSON escapes in constants
and property names (GBNF reads ``\\n``, ``\\"`` as its own escapes), regex escapes GBNF lacks
(``\\d``: the grammar would not parse).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from itertools import groupby
from typing import Any

from gguflm.grammar.gbnf import GrammarError

__all__ = ["json_schema_to_gbnf", "SchemaError", "UnsupportedSchemaError", "CONVERTERS"]

CONVERTERS = ("llama-cpp-python", "llama.cpp")

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_DEPTH = 200          # nested schemas; deeper ones are refused rather than overflowing the stack


class SchemaError(GrammarError):
    """The schema is malformed or cannot be converted."""


class UnsupportedSchemaError(SchemaError):
    """The schema asks for something the converter cannot express in a grammar."""


# keywords that never constrain a value
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "$anchor",
    "$defs", "definitions", "deprecated", "readOnly", "writeOnly", "contentMediaType",
    "contentEncoding", "$vocabulary", "$dynamicAnchor",
})
# keywords that constrain only values of some types: on a schema of one other type they are moot
_TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties", "patternProperties",
               "propertyNames", "minProperties", "maxProperties", "dependentRequired",
               "dependentSchemas", "unevaluatedProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains",
              "minContains", "maxContains", "unevaluatedItems", "additionalItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}
_TYPE_KEYWORDS["integer"] = _TYPE_KEYWORDS["number"]
_ALL_TYPED = frozenset().union(*_TYPE_KEYWORDS.values())
# keywords whose value here constrains nothing
_NO_OPS = {"uniqueItems": False, "minProperties": 0, "minItems": 0, "minLength": 0,
           "additionalItems": True, "unevaluatedProperties": True, "unevaluatedItems": True}

_INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_JSON_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)")


def _unsafe_json_escape(text: str) -> bool:
    """Whether JSON text holds an escape GBNF does not read back as the same JSON: all but
    \\uXXXX of a printable, non-surrogate character (GBNF reads that as the character itself,
    which is the same JSON string)."""
    for m in _JSON_ESCAPE.finditer(text):
        escape = m.group(1)
        if len(escape) != 5:
            return True
        cp = int(escape[1:], 16)
        if cp < 0x20 or 0xD800 <= cp <= 0xDFFF:
            return True
    return False


class BuiltinRule:
    """A predefined rule and the rules it uses."""

    def __init__(self, content: str, deps: tuple[str, ...] = ()) -> None:
        self.content = content
        self.deps = deps


# ---------------------------------------------------------------------------------------------
# repetitions, literals and integer ranges


def _repetition_py(item: str, min_items: int, max_items: int | None, separator: str | None = None,
                   item_is_literal: bool = False) -> str:
    """llama-cpp-python's ``_build_repetition``: nested optional groups, no ``{m,n}``."""
    if not separator:
        if min_items == 0 and max_items == 1:
            return f"{item}?"
        if min_items == 1 and max_items is None:
            return f"{item}+"
    result = ""
    if min_items > 0:
        if item_is_literal and separator is None:
            result = '"' + item[1:-1] * min_items + '"'
        else:
            result = (f" {separator} " if separator else " ").join([item] * min_items)

    def optional(up_to: int, prefix_with_sep: bool = False) -> str:
        content = f"{separator} {item}" if prefix_with_sep and separator else item
        if up_to == 0:
            return ""
        if up_to == 1:
            return f"({content})?"
        if separator and not prefix_with_sep:
            return f"({content} {optional(up_to - 1, prefix_with_sep=True)})?"
        return (f"({content} " * up_to).rstrip() + ")?" * up_to

    if min_items > 0 and max_items != min_items:
        result += " "
    if max_items is not None:
        result += optional(max_items - min_items, prefix_with_sep=min_items > 0)
    else:
        operator = f"({separator + ' ' if separator else ''}{item})"
        if min_items == 0 and separator:
            result = f"({item} {operator}*)?"
        else:
            result += f"{operator}*"
    return result


def _repetition_cpp(item: str, min_items: int, max_items: int, separator: str = "") -> str:
    """llama.cpp's ``build_repetition``: ``{m,n}`` quantifiers (``max_items`` INT32_MAX: none)."""
    has_max = max_items != INT32_MAX
    if max_items == 0:
        return ""
    if min_items == 0 and max_items == 1:
        return item + "?"
    if not separator:
        if min_items == 1 and not has_max:
            return item + "+"
        if min_items == 0 and not has_max:
            return item + "*"
        return item + "{" + str(min_items) + "," + (str(max_items) if has_max else "") + "}"
    result = item + " " + _repetition_cpp(f"({separator} {item})",
                                          0 if min_items == 0 else min_items - 1,
                                          max_items - 1 if has_max else max_items)
    return f"({result})?" if min_items == 0 else result


def _min_max_int(min_value: int, max_value: int, out: list[str], decimals_left: int = 16,
                 top_level: bool = True) -> None:
    """llama.cpp's ``build_min_max_int``: digits of the integers in [min, max] (INT64 ends:
    unbounded)."""
    has_min, has_max = min_value != INT64_MIN, max_value != INT64_MAX

    def digit_range(lo: str, hi: str) -> None:
        out.append("[" + (lo if lo == hi else f"{lo}-{hi}") + "]")

    def more_digits(lo: int, hi: int) -> None:
        out.append("[0-9]")
        if lo == hi == 1:
            return
        out.append("{" + str(lo))
        if hi != lo:
            out.append("," + (str(hi) if hi != INT32_MAX else ""))
        out.append("}")

    def uniform_range(frm: str, to: str) -> None:
        i = 0
        while i < len(frm) and i < len(to) and frm[i] == to[i]:
            i += 1
        if i > 0:
            out.append(f'"{frm[:i]}"')
        if i < len(frm) and i < len(to):
            if i > 0:
                out.append(" ")
            sub_len = len(frm) - i - 1
            if sub_len > 0:
                frm_sub, to_sub = frm[i + 1:], to[i + 1:]
                zeros, nines = "0" * sub_len, "9" * sub_len
                to_reached = False
                out.append("(")
                if frm_sub == zeros:
                    digit_range(frm[i], chr(ord(to[i]) - 1))
                    out.append(" ")
                    more_digits(sub_len, sub_len)
                else:
                    out.append(f"[{frm[i]}] (")
                    uniform_range(frm_sub, nines)
                    out.append(")")
                    if ord(frm[i]) < ord(to[i]) - 1:
                        out.append(" | ")
                        if to_sub == nines:
                            digit_range(chr(ord(frm[i]) + 1), to[i])
                            to_reached = True
                        else:
                            digit_range(chr(ord(frm[i]) + 1), chr(ord(to[i]) - 1))
                        out.append(" ")
                        more_digits(sub_len, sub_len)
                if not to_reached:
                    out.append(" | ")
                    digit_range(to[i], to[i])
                    out.append(" ")
                    uniform_range(zeros, to_sub)
                out.append(")")
            else:
                out.append(f"[{frm[i]}-{to[i]}]")

    if has_min and has_max:
        if min_value < 0 and max_value < 0:
            out.append('"-" (')
            _min_max_int(-max_value, -min_value, out, decimals_left, True)
            out.append(")")
            return
        if min_value < 0:
            out.append('"-" (')
            _min_max_int(0, -min_value, out, decimals_left, True)
            out.append(") | ")
            min_value = 0
        min_s, max_s = str(min_value), str(max_value)
        for digits in range(len(min_s), len(max_s)):
            uniform_range(min_s, "9" * digits)
            min_s = "1" + "0" * digits
            out.append(" | ")
        uniform_range(min_s, max_s)
        return
    less_decimals = max(decimals_left - 1, 1)
    if has_min:
        if min_value < 0:
            out.append('"-" (')
            _min_max_int(INT64_MIN, -min_value, out, decimals_left, False)
            out.append(") | [0] | [1-9] ")
            more_digits(0, decimals_left - 1)
        elif min_value == 0:
            if top_level:
                out.append("[0] | [1-9] ")
                more_digits(0, less_decimals)
            else:
                more_digits(1, decimals_left)
        elif min_value <= 9:
            c = str(min_value)
            range_start = "1" if top_level else "0"
            if c > range_start:
                digit_range(range_start, chr(ord(c) - 1))
                out.append(" ")
                more_digits(1, less_decimals)
                out.append(" | ")
            digit_range(c, "9")
            out.append(" ")
            more_digits(0, less_decimals)
        else:
            min_s = str(min_value)
            c = min_s[0]
            if len(min_s) > 2 and min_s[1] == "0":
                # llama.cpp reads the rest ("07" of 207) as a number (7) and loses its length:
                # its grammar then admits 27 and 200 for a minimum of 207
                _INEXACT.add(min_value)
            if c > "1":
                digit_range("1" if top_level else "0", chr(ord(c) - 1))
                out.append(" ")
                more_digits(len(min_s), less_decimals)
                out.append(" | ")
            digit_range(c, c)
            out.append(" (")
            _min_max_int(int(min_s[1:]), INT64_MAX, out, less_decimals, False)
            out.append(")")
            if c < "9":
                out.append(" | ")
                digit_range(chr(ord(c) + 1), "9")
                out.append(" ")
                more_digits(len(min_s) - 1, less_decimals)
        return
    if has_max:
        if max_value >= 0:
            if top_level:
                out.append('"-" [1-9] ')
                more_digits(0, less_decimals)
                out.append(" | ")
            _min_max_int(0, max_value, out, decimals_left, True)
        else:
            out.append('"-" (')
            _min_max_int(-max_value, INT64_MAX, out, decimals_left, False)
            out.append(")")
        return
    raise SchemaError("At least one of min_value or max_value must be set")


_INEXACT: set[int] = set()


def _integer_range(min_value: int, max_value: int, exact: bool = False) -> str:
    """The integers in [min, max] as llama.cpp's converter writes them; with ``exact``, where its
    digit rules would admit integers out of range, our own exact rules instead."""
    out: list[str] = []
    _INEXACT.clear()
    _min_max_int(min_value, max_value, out)
    if exact and _INEXACT:
        return "(" + _exact_range(min_value, max_value) + ")"
    return "(" + "".join(out) + ")"


_MAX_DIGITS = 16   # as llama.cpp's integral-part: at most 16 digits


def _same_length(lo: str, hi: str) -> str:
    """Digit strings of len(lo) == len(hi) from lo to hi (lexicographic = numeric order)."""
    n = len(lo) - 1
    if n == 0:
        return f"[{lo}-{hi}]" if lo != hi else f"[{lo}]"
    if lo[0] == hi[0]:
        return f'"{lo[0]}" (' + _same_length(lo[1:], hi[1:]) + ")"
    parts = []
    low_rest, high_rest = lo[1:], hi[1:]
    first, last = int(lo[0]), int(hi[0])
    if low_rest == "0" * n:
        first -= 1   # lo[0] takes every tail: joins the middle range
    else:
        parts.append(f"[{lo[0]}] (" + _same_length(low_rest, "9" * n) + ")")
    if high_rest == "9" * n:
        last += 1
    if first + 1 <= last - 1:
        a, b = first + 1, last - 1
        parts.append((f"[{a}]" if a == b else f"[{a}-{b}]") + f" [0-9]{{{n}}}")
    if high_rest != "9" * n:
        parts.append(f"[{hi[0]}] (" + _same_length("0" * n, high_rest) + ")")
    return " | ".join(parts)


def _non_negative(low: int, high: int | None) -> list[str]:
    """Alternatives for the integers in [low, high] (high None: up to 16 digits), low >= 0."""
    parts = []
    top = _MAX_DIGITS if high is None else len(str(high))
    for length in range(len(str(low)), top + 1):
        lo = str(low) if length == len(str(low)) else "1" + "0" * (length - 1)
        if high is None and length > len(str(low)):
            tail = f" [0-9]{{{length - 1},{_MAX_DIGITS - 1}}}" if length < _MAX_DIGITS else \
                f" [0-9]{{{length - 1}}}"
            parts.append("[1-9]" + tail)
            break
        hi = str(high) if high is not None and length == len(str(high)) else "9" * length
        parts.append(_same_length(lo, hi))
    return parts


def _exact_range(low: int, high: int) -> str:
    """The integers in [low, high] (INT64 ends: unbounded, up to 16 digits), our own rules."""
    parts = []
    if low == INT64_MIN or low < 0:
        neg_high = None if low == INT64_MIN else -low        # |values| up to this
        neg_low = 1 if high == INT64_MAX or high >= 0 else -high
        if neg_high is None or neg_low <= neg_high:
            parts.append('"-" (' + " | ".join(_non_negative(neg_low, neg_high)) + ")")
    if high == INT64_MAX or high >= 0:
        parts += _non_negative(max(low, 0) if low != INT64_MIN else 0,
                               None if high == INT64_MAX else high)
    return " | ".join(parts)


# ---------------------------------------------------------------------------------------------
# the two dialects' predefined rules

_UP_TO_15_DIGITS = _repetition_py("[0-9]", 0, 15)

PY_SPACE_RULE = '" "?'
PY_PRIMITIVES = {
    "boolean": BuiltinRule('("true" | "false") space'),
    "decimal-part": BuiltinRule("[0-9] " + _UP_TO_15_DIGITS),
    "integral-part": BuiltinRule("[0-9] | [1-9] " + _UP_TO_15_DIGITS),
    "number": BuiltinRule('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? '
                          'space', ("integral-part", "decimal-part")),
    "integer": BuiltinRule('("-"? integral-part) space', ("integral-part",)),
    "value": BuiltinRule("object | array | string | number | boolean | null",
                         ("object", "array", "string", "number", "boolean", "null")),
    "object": BuiltinRule('"{" space ( string ":" space value ("," space string ":" space value)* '
                          ')? "}" space', ("string", "value")),
    "array": BuiltinRule('"[" space ( value ("," space value)* )? "]" space', ("value",)),
    "uuid": BuiltinRule(r'"\"" ' + ' "-" '.join("[0-9a-fA-F]" * n for n in (8, 4, 4, 4, 12))
                        + r' "\"" space'),
    "char": BuiltinRule(r'[^"\\] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] '
                        r'[0-9a-fA-F])'),
    "string": BuiltinRule(r'"\"" char* "\"" space', ("char",)),
    "null": BuiltinRule('"null" space'),
}
PY_FORMATS = {
    "date": BuiltinRule('[0-9] [0-9] [0-9] [0-9] "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | '
                        '[1-2] [0-9] | "3" [0-1] )'),
    "time": BuiltinRule('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9] '
                        '[0-9] [0-9] )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" '
                        '[0-5] [0-9] )'),
    "date-time": BuiltinRule('date "T" time', ("date", "time")),
    "date-string": BuiltinRule('"\\"" date "\\"" space', ("date",)),
    "time-string": BuiltinRule('"\\"" time "\\"" space', ("time",)),
    "date-time-string": BuiltinRule('"\\"" date-time "\\"" space', ("date-time",)),
}

CPP_SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'
CPP_PRIMITIVES = {
    "boolean": BuiltinRule('("true" | "false")'),
    "decimal-part": BuiltinRule("[0-9]{1,16}"),
    "integral-part": BuiltinRule("[0] | [1-9] [0-9]{0,15}"),
    "number": BuiltinRule('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
                          ("integral-part", "decimal-part")),
    "integer": BuiltinRule('("-"? integral-part)', ("integral-part",)),
    "value": BuiltinRule("object | array | string | number | boolean | null",
                         ("object", "array", "string", "number", "boolean", "null")),
    "object": BuiltinRule('"{" space ( string ":" space value ("," space string ":" space value)* '
                          ')? space "}"', ("string", "value")),
    "array": BuiltinRule('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": BuiltinRule(r'"\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
                        r'[0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\""'),
    "char": BuiltinRule(r'[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})'),
    "string": BuiltinRule(r'"\"" char* "\""', ("char",)),
    "null": BuiltinRule('"null"'),
}
CPP_FORMATS = {
    "date": BuiltinRule('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | '
                        '"3" [0-1] )'),
    "time": BuiltinRule('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} '
                        ')? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )'),
    "date-time": BuiltinRule('date "T" time', ("date", "time")),
    "date-string": BuiltinRule('"\\"" date "\\""', ("date",)),
    "time-string": BuiltinRule('"\\"" time "\\""', ("time",)),
    "date-time-string": BuiltinRule('"\\"" date-time "\\""', ("date-time",)),
}


# ---------------------------------------------------------------------------------------------
# regular expressions -> GBNF


class _UnsupportedPattern(Exception):
    """A valid regular expression with no GBNF equivalent (llama.cpp falls back to a string)."""


class _PatternTranslator:
    """``_visit_pattern`` of both converters: a ``^...$`` regex into a GBNF rule body.

    ``cpp`` selects llama.cpp's variant: ``(?:`` groups, anchors and bad escapes refused,
    GBNF escapes checked, consecutive literals merged; otherwise llama-cpp-python's (which
    joins literals only when the whole sequence is one literal).
    """

    def __init__(self, converter: _Converter, pattern: str, name: str, cpp: bool) -> None:
        self.c, self.name, self.cpp = converter, name, cpp
        self.pattern = pattern[1:-1]
        self.i = 0
        self.depth = 0
        self.sub_rule_ids: dict[str, str] = {}
        self.non_literal = set("|.()[]{}*+?" + ("^$" if cpp else ""))
        self.escaped_in_regexps = set("[]()|{}*+?" + ("^$." if cpp else ""))

    @staticmethod
    def to_rule(item: tuple[str, bool]) -> str:
        text, is_literal = item
        return f'"{text}"' if is_literal else text

    def dot(self) -> str:
        if self.c.strict and not self.c.raw_pattern:
            # inside a JSON string a raw quote, backslash or control character is not the
            # character: strict leaves them out (the references' dot admits them)
            return self.c._add_rule("dot", _JSON_STRING_CHAR)
        return self.c._add_rule("dot", "[\\U00000000-\\U0010FFFF]" if self.c.dotall
                                else "[^\\x0A\\x0D]")

    def json_class(self, text: str) -> str:
        """A character class as it may stand inside a JSON string (strict): a negated class
        also excludes quote, backslash and control characters; a positive one must not hold
        them."""
        if not self.c.strict or self.c.raw_pattern:
            return text
        if text.startswith("[^"):
            return "[^" + _JSON_STRING_EXCLUDED + text[2:]
        if _class_admits_json_special(text):
            raise UnsupportedSchemaError(
                f"pattern class {text} admits a quote, backslash or control character, which "
                f"a JSON string holds only escaped; the converters cannot express that")
        return text

    def json_literal(self, literal: str) -> str:
        """A literal as it may stand inside a JSON string (strict): no quote, backslash or
        control character."""
        if self.c.strict and not self.c.raw_pattern and re.search(
                r'\\(["\\ntr]|x[01]|u00[01])', literal):
            raise UnsupportedSchemaError(
                f"pattern text {literal!r} holds a quote, backslash or control character, which "
                f"a JSON string holds only escaped; the converters cannot express that")
        return literal

    def join(self, seq: list[tuple[str, bool]]) -> tuple[str, bool]:
        if self.cpp:
            merged: list[tuple[str, bool]] = []
            for is_literal, group in groupby(seq, lambda x: x[1]):
                if is_literal:
                    merged.append(("".join(x[0] for x in group), True))
                else:
                    merged.extend(group)
            return " ".join(self.to_rule(x) for x in merged), False
        merged = []
        for is_literal, group in groupby(seq, lambda x: x[1]):
            if is_literal:
                merged.append(("".join(x[0] for x in group), True))
            else:
                merged.extend(group)
        if len(merged) == 1:
            return merged[0]
        return " ".join(self.to_rule(x) for x in seq), False

    def transform(self) -> tuple[str, bool]:
        """One sequence at index i (advancing it), as (text, is_literal)."""
        p, n = self.pattern, len(self.pattern)
        start = self.i
        seq: list[tuple[str, bool]] = []
        while self.i < n:
            c = p[self.i]
            if c == ".":
                seq.append((self.dot(), False))
                self.i += 1
            elif c == "(":
                self.i += 1
                if self.i < n and p[self.i] == "?":
                    if self.cpp and self.i + 1 < n and p[self.i + 1] == ":":
                        self.i += 2
                    elif self.cpp:
                        raise _UnsupportedPattern("unsupported group syntax")
                    else:
                        raise UnsupportedSchemaError(
                            f'Unsupported pattern syntax "{p[self.i]}" at index {self.i} of /{p}/')
                self.depth += 1
                if self.depth > (100 if self.cpp else MAX_DEPTH):
                    if self.cpp:
                        raise _UnsupportedPattern("pattern nesting too deep")
                    raise UnsupportedSchemaError(f"pattern nested too deeply: /{p}/")
                seq.append((f"({self.to_rule(self.transform())})", False))
            elif c == ")":
                self.i += 1
                if self.cpp:
                    if self.depth == 0:
                        raise SchemaError("unbalanced parentheses")
                elif not (start > 0 and p[start - 1] == "("):
                    raise SchemaError(f"Unbalanced parentheses; start = {start}, i = {self.i}, "
                                      f"pattern = {p}")
                self.depth -= 1
                return self.join(seq)
            elif self.cpp and c in "^$":
                raise _UnsupportedPattern("anchor inside the pattern")
            elif c == "[":
                text = c
                self.i += 1
                while self.i < n and p[self.i] != "]":
                    if p[self.i] == "\\":
                        if self.cpp:
                            k = _gbnf_escape_length(p, self.i)
                            if k == 0:
                                raise _UnsupportedPattern("unsupported escape in character class: "
                                                          + p[self.i:self.i + 2])
                        else:
                            k = 2
                            self.check_escape()
                        text += p[self.i:self.i + k]
                        self.i += k
                    else:
                        text += p[self.i]
                        self.i += 1
                if self.i >= n:
                    if self.cpp:
                        raise SchemaError("unterminated character class")
                    raise SchemaError(f"Unbalanced square brackets; start = {start}, i = {self.i}, "
                                      f"pattern = {p}")
                seq.append((self.json_class(text + "]"), False))
                self.i += 1
            elif c == "|":
                seq.append(("|", False))
                self.i += 1
            elif c in "*+?":
                if not seq:
                    raise SchemaError("nothing to repeat")
                seq[-1] = (self.to_rule(seq[-1]) + c, False)
                self.i += 1
            elif c == "{":
                self.repetition(seq, start)
            else:
                literal = self.literal()
                if not literal:   # nothing consumed, e.g. a stray ']' or '}'
                    if self.cpp:
                        raise _UnsupportedPattern(f"unsupported character: {c}")
                    # llama-cpp-python's converter loops forever here
                    raise UnsupportedSchemaError(f"unsupported character {c!r} at {self.i} in "
                                                 f"/{self.pattern}/")
                seq.append((self.json_literal(literal), True))
        return self.join(seq)

    def repetition(self, seq: list[tuple[str, bool]], start: int) -> None:
        p, n = self.pattern, len(self.pattern)
        text = "{"
        self.i += 1
        while self.i < n and p[self.i] != "}":
            text += p[self.i]
            self.i += 1
        if self.i >= n:
            if self.cpp:
                raise _UnsupportedPattern("unterminated curly brackets")
            raise SchemaError(f"Unbalanced curly brackets; start = {start}, i = {self.i}, "
                              f"pattern = {p}")
        text += "}"
        self.i += 1
        nums = [s.strip() if not self.cpp else s for s in text[1:-1].split(",")]
        if self.cpp:
            nums = _cpp_split(text[1:-1], ",")
            if len(nums) not in (1, 2):
                raise _UnsupportedPattern("wrong number of values in curly brackets")
            try:
                if len(nums) == 1:
                    min_times = max_times = _stoi(nums[0])
                else:
                    min_times = _stoi(nums[0]) if nums[0] else 0
                    max_times = _stoi(nums[1]) if nums[1] else INT32_MAX
            except ValueError:
                raise _UnsupportedPattern("invalid number in curly brackets") from None
            if not seq:
                raise SchemaError("nothing to repeat")
        else:
            try:
                if len(nums) == 1:
                    min_times = max_times = int(nums[0])
                else:
                    if len(nums) != 2:
                        raise ValueError
                    min_times = int(nums[0]) if nums[0] else 0
                    max_times = int(nums[1]) if nums[1] else None
            except ValueError:
                raise SchemaError(f"Invalid quantifier {text} in /{p}/") from None
            if not seq:
                raise SchemaError(f"nothing to repeat in /{p}/")
        sub, sub_is_literal = seq[-1]
        if not sub_is_literal:
            rule_id = self.sub_rule_ids.get(sub)
            if rule_id is None:
                rule_id = self.c._add_rule(f"{self.name}-{len(self.sub_rule_ids) + 1}", sub)
                self.sub_rule_ids[sub] = rule_id
            sub = rule_id
        if self.cpp:
            seq[-1] = (_repetition_cpp(f'"{sub}"' if sub_is_literal else sub, min_times,
                                       max_times), False)
        else:
            seq[-1] = (_repetition_py(f'"{sub}"' if sub_is_literal else sub, min_times,
                                      max_times, item_is_literal=sub_is_literal), False)

    def check_escape(self) -> None:
        """llama-cpp-python copies regex escapes into the grammar as they are; GBNF has no
        ``\\d``, ``\\w``, ``\\s``, ... (strict: say so now rather than fail to parse later)."""
        if self.c.strict and _gbnf_escape_length(self.pattern, self.i) == 0:
            raise UnsupportedSchemaError(
                f"pattern escape {self.pattern[self.i:self.i + 2]!r} has no GBNF equivalent in "
                f"the llama-cpp-python converter (it writes a grammar that does not parse)")

    def literal(self) -> str:
        p, n = self.pattern, len(self.pattern)
        literal = ""
        while self.i < n:
            c = p[self.i]
            if c == "\\" and (self.cpp or self.i < n - 1):
                if self.i == n - 1:
                    raise SchemaError("trailing backslash")
                nxt = p[self.i + 1]
                if nxt in self.escaped_in_regexps:
                    self.i += 1
                    literal += p[self.i]
                    self.i += 1
                elif self.cpp:
                    k = _gbnf_escape_length(p, self.i)
                    if k == 0:
                        raise _UnsupportedPattern("unsupported escape: " + p[self.i:self.i + 2])
                    literal += p[self.i:self.i + k]
                    self.i += k
                else:
                    self.check_escape()
                    literal += p[self.i:self.i + 2]
                    self.i += 2
            elif c == '"' and (self.cpp or not self.c.raw_pattern):
                literal += '\\"'
                self.i += 1
            elif c not in self.non_literal and (self.i == n - 1 or literal == ""
                                                or p[self.i + 1] == "."
                                                or p[self.i + 1] not in self.non_literal):
                literal += c
                self.i += 1
            else:
                break
        return literal


# what a JSON string holds raw: anything but a quote, a backslash and control characters
_JSON_STRING_EXCLUDED = '"\\\\\\x00-\\x1F'
_JSON_STRING_CHAR = "[^" + _JSON_STRING_EXCLUDED + "]"


def _class_admits_json_special(text: str) -> bool:
    """Whether a GBNF character class admits a quote, a backslash or a control character."""
    from gguflm.grammar.gbnf import CHAR_ALT, CHAR_RNG_UPPER, parse

    rule = parse("root ::= " + text).rules[0]
    ranges, i = [], 0
    while i < len(rule) - 1:
        lo = rule[i][1]
        if i + 1 < len(rule) and rule[i + 1][0] == CHAR_RNG_UPPER:
            ranges.append((lo, rule[i + 1][1]))
            i += 2
        else:
            ranges.append((lo, lo))
            i += 1
        if i < len(rule) and rule[i][0] != CHAR_ALT:
            break
    special = [0x22, 0x5C, *range(0x20)]
    return any(lo <= c <= hi for c in special for lo, hi in ranges)


def _gbnf_escape_length(pattern: str, pos: int) -> int:
    """llama.cpp's ``gbnf_escape_length``: length of a GBNF escape at pos, 0 if none."""
    if pos + 1 >= len(pattern) or pattern[pos] != "\\":
        return 0
    e = pattern[pos + 1]
    if e in 'trn\\"[]-':
        return 2
    n_hex = {"x": 2, "u": 4, "U": 8}.get(e)
    if n_hex is None or pos + 2 + n_hex > len(pattern):
        return 0
    if not all(h in "0123456789abcdefABCDEF" for h in pattern[pos + 2:pos + 2 + n_hex]):
        return 0
    return 2 + n_hex


def _cpp_split(text: str, sep: str) -> list[str]:
    """llama.cpp's ``string_split`` (a trailing separator gives a trailing empty part)."""
    return text.split(sep)


def _stoi(text: str) -> int:
    """std::stoi: leading spaces and a sign, digits, then anything; out of int range is an
    error."""
    m = re.match(r"\s*([+-]?\d+)", text)
    if not m:
        raise ValueError(text)
    value = int(m.group(1))
    if not -(2**31) <= value <= INT32_MAX:
        raise ValueError(text)
    return value


# ---------------------------------------------------------------------------------------------
# the converters


class _Converter:
    """What both converters share: rules by name (llama.cpp's ``_add_rule`` renaming),
    predefined rules with their dependencies, unions, object rules, strictness."""

    primitives: dict[str, BuiltinRule]
    formats: dict[str, BuiltinRule]
    space_rule: str

    def __init__(self, strict: bool, dotall: bool = False, raw_pattern: bool = False) -> None:
        self.strict = strict
        self.dotall = dotall
        self.raw_pattern = raw_pattern
        self._rules: dict[str, str] = {"space": self.space_rule}
        self._refs_being_resolved: set[str] = set()
        self._depth = 0

    # -- rules

    def _add_rule(self, name: str, rule: str) -> str:
        esc_name = _INVALID_RULE_CHARS.sub("-", name)
        if esc_name not in self._rules or self._rules[esc_name] == rule:
            key = esc_name
        else:
            i = 0
            while f"{esc_name}{i}" in self._rules and self._rules[f"{esc_name}{i}"] != rule:
                i += 1
            key = f"{esc_name}{i}"
        self._rules[key] = rule
        return key

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        n = self._add_rule(name, rule.content)
        for dep in rule.deps:
            dep_rule = self.primitives.get(dep) or self.formats.get(dep)
            if dep_rule is None:
                raise SchemaError(f"Rule {dep} not known")
            if dep not in self._rules:
                self._add_primitive(dep, dep_rule)
        return n

    def format_grammar(self) -> str:
        raise NotImplementedError

    def _not_strings(self, strings: list[str]) -> str:
        """A JSON string that is none of ``strings`` (llama.cpp's ``_not_strings`` trie walk)."""
        trie: dict[str, Any] = {}
        ends_root = False
        for s in strings:
            node = trie
            if not s:
                ends_root = True
            for ch in s:
                node = node.setdefault(ch, {})
            node.setdefault("", True)   # marks an end (key "" sorts first, never a char)
        char_rule = self._add_primitive("char", self.primitives["char"])
        if self.strict and not any(trie):
            # only "" to exclude: the references write a rule that admits exactly ""
            return f'["] {char_rule}+ ["]'
        out: list[str] = ['["] ( ']

        def visit(node: dict[str, Any]) -> None:
            children = sorted((k for k in node if k), key=ord)
            for i, ch in enumerate(children):
                if i:
                    out.append(" | ")
                out.append(f"[{ch}]")
                child = node[ch]
                if any(k for k in child):
                    out.append(" (")
                    visit(child)
                    out.append(")")
                else:
                    out.append(f" {char_rule}+")
            if children:
                # strict: the first character of the rest may not be a raw backslash or control
                # character either (the references' class admits them: invalid JSON)
                extra = _JSON_STRING_EXCLUDED[1:] if self.strict else ""
                out.append(f' | [^"{extra}{"".join(children)}] {char_rule}*')

        visit(trie)
        out.append(" )")
        if not ends_root:
            out.append("?")
        out.append(' ["]')
        return "".join(out)

    # -- strictness

    def _unsupported(self, schema: Mapping[str, Any], used: set[str], path: str) -> None:
        """Raise (strict) for keywords of ``schema`` that the branch taken did not honour."""
        if not self.strict:
            return
        moot: set[str] = set()
        schema_type = schema.get("type")
        if isinstance(schema_type, str) and schema_type in _TYPE_KEYWORDS | {"boolean": 0,
                                                                              "null": 0}:
            moot = _ALL_TYPED - _TYPE_KEYWORDS.get(schema_type, set())
        left = sorted(k for k in schema if k not in used and k not in ANNOTATIONS
                      and k not in moot and not (k in _NO_OPS and schema[k] == _NO_OPS[k]))
        if left:
            raise UnsupportedSchemaError(
                f"JSON schema keyword{'s' if len(left) > 1 else ''} {', '.join(map(repr, left))} "
                f"at {path} cannot be expressed by the {self.dialect} converter (pass "
                f"strict=False to drop {'them' if len(left) > 1 else 'it'} as the reference "
                f"converter does)")

    def _check_property_name(self, name: str, prop_name: str, path: str) -> None:
        """An empty property name of the root object takes the rule name "root" in both
        reference converters, so the grammar's root becomes that property's value."""
        if self.strict and not name and not prop_name:
            raise UnsupportedSchemaError(
                f"an empty property name at {path} of the top-level object makes the "
                f"{self.dialect} converter's grammar start at that property's value; pass "
                f"strict=False for the reference's grammar as it is")

    def _enter(self, path: str) -> None:
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise UnsupportedSchemaError(f"schema nested deeper than {MAX_DEPTH} levels at {path}")

    def _leave(self) -> None:
        self._depth -= 1

    dialect = ""


def _sub(name: str, suffix: str) -> str:
    return f"{name}{'-' if name else ''}{suffix}"


class LlamaCppPythonConverter(_Converter):
    """llama-cpp-python 0.3.36's ``SchemaConverter`` (``llama_cpp/llama_grammar.py``)."""

    primitives = PY_PRIMITIVES
    formats = PY_FORMATS
    space_rule = PY_SPACE_RULE
    dialect = "llama-cpp-python"
    reserved = frozenset({"root", "dot", *PY_PRIMITIVES, *PY_FORMATS})

    def __init__(self, strict: bool, prop_order: Mapping[str, int]) -> None:
        super().__init__(strict)
        self._prop_order = prop_order
        self._refs: dict[str, Any] = {}

    def _format_literal(self, literal: str) -> str:
        if self.strict and _unsafe_json_escape(literal):
            raise UnsupportedSchemaError(
                f"the llama-cpp-python converter leaves the JSON escapes in {literal!r} for the "
                f"grammar to read as its own (it would match other text); use "
                f"converter='llama.cpp' or strict=False")
        escaped = re.sub(r'[\r\n"]', lambda m: {"\r": "\\r", "\n": "\\n", '"': '\\"'}[m.group(0)],
                         literal)
        return f'"{escaped}"'

    # -- $ref

    def resolve_refs(self, schema: Any, url: str) -> Any:
        """Rewrite local ``$ref``s to ``url#/...`` and record their targets."""
        def visit(n: Any, depth: int) -> Any:
            if depth > MAX_DEPTH:
                raise UnsupportedSchemaError(f"schema nested deeper than {MAX_DEPTH} levels")
            if isinstance(n, list):
                return [visit(x, depth + 1) for x in n]
            if isinstance(n, dict):
                ref = n.get("$ref")
                if ref is not None and ref not in self._refs:
                    if not isinstance(ref, str):
                        raise SchemaError(f"$ref must be a string, not {ref!r}")
                    if ref.startswith("https://"):
                        raise UnsupportedSchemaError(f"remote $ref {ref}: fetching schemas is "
                                                     f"not allowed")
                    if not ref.startswith("#/"):
                        raise UnsupportedSchemaError(f"Unsupported ref {ref}")
                    target = schema
                    ref = f"{url}{ref}"
                    n["$ref"] = ref
                    for sel in ref.split("#")[-1].split("/")[1:]:
                        if not (isinstance(target, (dict, list)) and sel in target):
                            raise SchemaError(f"Error resolving ref {ref}: {sel} not in "
                                              f"{str(target)[:200]}")
                        target = target[sel]
                    self._refs[ref] = target
                else:
                    for v in n.values():
                        visit(v, depth + 1)
            return n
        return visit(schema, 0)

    def _resolve_ref(self, ref: str) -> str:
        ref_name = ref.split("/")[-1]
        if ref_name not in self._rules and ref not in self._refs_being_resolved:
            self._refs_being_resolved.add(ref)
            if ref not in self._refs:
                raise SchemaError(f"unresolved $ref {ref}")
            ref_name = self.visit(self._refs[ref], ref_name, ref)
            self._refs_being_resolved.discard(ref)
        return ref_name

    # -- the schema

    def _union(self, name: str, alternatives: list[Any], path: str) -> str:
        return " | ".join(self.visit(alt, f"{name}{'-' if name else 'alternative-'}{i}",
                                     f"{path}/{i}")
                          for i, alt in enumerate(alternatives))

    def visit(self, schema: Any, name: str, path: str = "#") -> str:
        if not isinstance(schema, dict):
            raise SchemaError(f"schema at {path} must be an object, not {schema!r}")
        self._enter(path)
        try:
            return self._visit(schema, name, path)
        finally:
            self._leave()

    def _visit(self, schema: dict[str, Any], name: str, path: str) -> str:
        schema_type = schema.get("type")
        schema_format = schema.get("format")
        rule_name = name + "-" if name in self.reserved else name or "root"
        check = self._unsupported

        if (ref := schema.get("$ref")) is not None:
            check(schema, {"$ref"}, path)
            return self._add_rule(rule_name, self._resolve_ref(ref))
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if schema.get("oneOf") else "anyOf"
            if key not in schema:
                raise SchemaError(f"oneOf at {path} is empty")
            check(schema, {key, "type"}, path)
            return self._add_rule(rule_name, self._union(name, schema[key], f"{path}/{key}"))
        if isinstance(schema_type, list):
            check(schema, {"type"}, path)
            return self._add_rule(rule_name, self._union(name, [{"type": t} for t in schema_type],
                                                         f"{path}/type"))
        if "const" in schema:
            check(schema, {"const", "type"}, path)
            return self._add_rule(rule_name, self._format_literal(json.dumps(schema["const"])))
        if "enum" in schema:
            check(schema, {"enum", "type"}, path)
            return self._add_rule(rule_name, " | ".join(
                self._format_literal(json.dumps(v)) for v in schema["enum"]))
        if schema_type in (None, "object") and (
                "properties" in schema or ("additionalProperties" in schema
                                           and schema["additionalProperties"] is not True)):
            check(schema, {"type", "properties", "required", "additionalProperties"}, path)
            required = set(schema.get("required", []))
            properties = list(schema.get("properties", {}).items())
            self._check_required(required, properties, path)
            return self._add_rule(rule_name, self._object_rule(
                properties, required, name, schema.get("additionalProperties"), path))
        if schema_type in (None, "object") and "allOf" in schema:
            check(schema, {"type", "allOf"}, path)
            return self._add_rule(rule_name, self._all_of(schema["allOf"], name, path))
        if schema_type in (None, "array") and ("items" in schema or "prefixItems" in schema):
            return self._add_rule(rule_name, self._array(schema, name, path))
        if schema_type in (None, "string") and "pattern" in schema:
            check(schema, {"type", "pattern"}, path)
            return self._visit_pattern(schema["pattern"], rule_name)
        if schema_type in (None, "string") and re.match(r"^uuid[1-5]?$", schema_format or ""):
            check(schema, {"type", "format"}, path)
            return self._add_primitive("root" if rule_name == "root" else schema_format,
                                       self.primitives["uuid"])
        if schema_type in (None, "string") and f"{schema_format}-string" in self.formats:
            check(schema, {"type", "format"}, path)
            prim_name = f"{schema_format}-string"
            return self._add_rule(rule_name, self._add_primitive(prim_name,
                                                                 self.formats[prim_name]))
        if schema_type == "string" and ("minLength" in schema or "maxLength" in schema):
            check(schema, {"type", "minLength", "maxLength"}, path)
            char_rule = self._add_primitive("char", self.primitives["char"])
            min_len, max_len = _count_range(schema, "minLength", "maxLength", path, None)
            return self._add_rule(rule_name, r'"\"" ' + _repetition_py(char_rule, min_len, max_len)
                                  + r' "\"" space')
        if schema_type == "object" or len(schema) == 0:
            check(schema, {"type"} | ({"additionalProperties"}
                                      if schema.get("additionalProperties") is True else set()),
                  path)
            return self._add_rule(rule_name, self._add_primitive("object",
                                                                 self.primitives["object"]))
        if schema_type == "integer" and self.strict and any(
                k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
            check(schema, {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
                  path)
            low, high = _integer_bounds(schema, path)
            return self._add_rule(rule_name, _integer_range(low, high, exact=True) + " space")
        if schema_type is None and self.strict and all(k in ANNOTATIONS for k in schema):
            return self._add_rule(rule_name, self._add_primitive("value", self.primitives["value"]))
        if not isinstance(schema_type, str) or schema_type not in self.primitives:
            check(schema, {"type"}, path)   # names an unsupported keyword, if that is the cause
            raise UnsupportedSchemaError(f"Unrecognized schema at {path}: {str(schema)[:200]}")
        check(schema, {"type"}, path)
        return self._add_primitive("root" if rule_name == "root" else schema_type,
                                   self.primitives[schema_type])

    def _check_required(self, required: set[str], properties: list[tuple[str, Any]],
                        path: str) -> None:
        missing = sorted(required - {k for k, _ in properties})
        if missing and self.strict:
            raise UnsupportedSchemaError(f"required properties {missing} at {path} have no "
                                         f"'properties' entry: the grammar cannot produce them")

    def _all_of(self, components: list[Any], name: str, path: str) -> str:
        required: set[str] = set()
        properties: list[tuple[str, Any]] = []

        def add(component: Any, is_required: bool, where: str) -> None:
            if not isinstance(component, dict):
                raise SchemaError(f"allOf component at {where} must be an object")
            if (ref := component.get("$ref")) is not None:
                if ref not in self._refs:
                    raise SchemaError(f"unresolved $ref {ref}")
                component = self._refs[ref]
            if self.strict:
                allowed = {"properties", "type", "required", "additionalProperties"}
                if component.get("type", "object") != "object" or (
                        not is_required and "required" in component):
                    allowed = {"properties"}
                self._unsupported(component, allowed, where)
            for prop_name, prop_schema in component.get("properties", {}).items():
                properties.append((prop_name, prop_schema))
                if is_required:
                    required.add(prop_name)

        for i, component in enumerate(components):
            where = f"{path}/allOf/{i}"
            if isinstance(component, dict) and "anyOf" in component:
                self._unsupported(component, {"anyOf"}, where)
                for j, alt in enumerate(component["anyOf"]):
                    add(alt, False, f"{where}/anyOf/{j}")
            else:
                add(component, True, where)
        return self._object_rule(properties, required, name, [], path)

    def _array(self, schema: dict[str, Any], name: str, path: str) -> str:
        items = schema.get("items") or schema.get("prefixItems")
        if not items:   # llama-cpp-python fails here (KeyError) on an empty items schema
            raise UnsupportedSchemaError(f"empty 'items' at {path}: the llama-cpp-python "
                                         f"converter cannot convert it")
        if isinstance(items, list):
            self._unsupported(schema, {"type", "items" if schema.get("items") else "prefixItems"}
                              | self._tuple_counts(schema, len(items)), path)
            return '"[" space ' + ' "," space '.join(
                self.visit(item, _sub(name, f"tuple-{i}"), f"{path}/items/{i}")
                for i, item in enumerate(items)) + ' "]" space'
        self._unsupported(schema, {"type", "items" if schema.get("items") else "prefixItems",
                                   "minItems", "maxItems"}, path)
        item_rule = self.visit(items, _sub(name, "item"), f"{path}/items")
        min_items, max_items = _count_range(schema, "minItems", "maxItems", path, None)
        return '"[" space ' + _repetition_py(item_rule, min_items, max_items,
                                             separator='"," space') + ' "]" space'

    @staticmethod
    def _tuple_counts(schema: dict[str, Any], n: int) -> set[str]:
        """minItems/maxItems a tuple of n items satisfies anyway."""
        ok = set()
        if isinstance(schema.get("minItems"), int) and schema["minItems"] <= n:
            ok.add("minItems")
        if isinstance(schema.get("maxItems"), int) and schema["maxItems"] >= n:
            ok.add("maxItems")
        return ok

    def _visit_pattern(self, pattern: Any, name: str) -> str:
        if not isinstance(pattern, str) or not (pattern.startswith("^") and pattern.endswith("$")):
            raise UnsupportedSchemaError(f'Pattern must start with "^" and end with "$": '
                                         f'{pattern!r}')
        translator = _PatternTranslator(self, pattern, name, cpp=False)
        body = translator.to_rule(translator.transform())
        return self._add_rule(name, body if self.raw_pattern else '"\\"" ' + body + ' "\\"" space')

    def _object_rule(self, properties: list[tuple[str, Any]], required: set[str], name: str,
                     additional: Any, path: str) -> str:
        order = self._prop_order
        sorted_props = [kv[0] for _, kv in sorted(
            enumerate(properties), key=lambda ikv: (order.get(ikv[1][0], len(order)), ikv[0]))]
        kv_rules: dict[str, str] = {}
        for prop_name, prop_schema in properties:
            self._check_property_name(name, prop_name, path)
            prop_rule = self.visit(prop_schema, _sub(name, prop_name), f"{path}/properties/{prop_name}")
            kv_rules[prop_name] = self._add_rule(
                _sub(name, f"{prop_name}-kv"),
                f'{self._format_literal(json.dumps(prop_name))} space ":" space {prop_rule}')
        required_props = [k for k in sorted_props if k in required]
        optional_props = [k for k in sorted_props if k not in required]
        if additional == True or isinstance(additional, dict):  # noqa: E712 (1 counts, as there)
            sub_name = _sub(name, "additional")
            value_rule = self.visit({} if additional == True else additional,  # noqa: E712
                                    f"{sub_name}-value", f"{path}/additionalProperties")
            if self.strict and properties:
                # llama-cpp-python lets an additional key repeat a property's name (with a value
                # of the additional schema); strict excludes those names, as llama.cpp does
                key_rule = self._add_rule(f"{sub_name}-k", self._not_strings(
                    [k for k, _ in properties]) + " space")
            else:
                key_rule = self._add_primitive("string", self.primitives["string"])
            kv_rules["*"] = self._add_rule(f"{sub_name}-kv", key_rule + f' ":" space {value_rule}')
            optional_props.append("*")

        rule = '"{" space '
        rule += ' "," space '.join(kv_rules[k] for k in required_props)
        if optional_props:
            rule += " ("
            if required_props:
                rule += ' "," space ( '

            def recursive_refs(ks: list[str], first_is_optional: bool) -> str:
                k, *rest = ks
                kv_rule = kv_rules[k]
                if k == "*" and first_is_optional and self.strict:
                    # llama-cpp-python drops the comma before additional properties that follow
                    # an optional one (invalid JSON); strict writes it, as llama.cpp does
                    res = f'( "," space {kv_rule} )*'
                elif k == "*":
                    res = self._add_rule(_sub(name, "additional-kvs"),
                                         f'{kv_rule} ( "," space ' + kv_rule + " )*")
                elif first_is_optional:
                    res = f'( "," space {kv_rule} )?'
                else:
                    res = kv_rule
                if rest:
                    res += " " + self._add_rule(_sub(name, f"{k}-rest"),
                                                recursive_refs(rest, first_is_optional=True))
                return res

            rule += " | ".join(recursive_refs(optional_props[i:], first_is_optional=False)
                               for i in range(len(optional_props)))
            if required_props:
                rule += " )"
            rule += " )?"
        rule += ' "}" space'
        return rule

    def format_grammar(self) -> str:
        return "\n".join(f"{name} ::= {rule}" for name, rule in sorted(self._rules.items()))


class LlamaCppConverter(_Converter):
    """llama.cpp's ``common_chat_schema_converter`` over its schema model
    (``common/json-schema.cpp`` builds the model, ``common/json-schema-to-grammar.cpp`` writes
    the grammar). The model is kept as the schema dicts themselves: each node is classified by
    :meth:`_kind` as llama.cpp's builder classifies it."""

    primitives = CPP_PRIMITIVES
    formats = CPP_FORMATS
    space_rule = CPP_SPACE_RULE
    dialect = "llama.cpp"
    reserved = frozenset({"root", *CPP_PRIMITIVES, *CPP_FORMATS})

    def __init__(self, strict: bool, root: dict[str, Any]) -> None:
        super().__init__(strict)
        self._root = root
        self._errors: list[str] = []
        self.warnings: list[str] = []

    @staticmethod
    def _format_literal(literal: str) -> str:
        escapes = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
        return '"' + re.sub(r'[\r\n"\\]', lambda m: escapes[m.group(0)], literal) + '"'

    @staticmethod
    def _dump(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    def _constant(self, value: Any) -> str:
        return self._format_literal(self._dump(value))

    # -- the schema model (json-schema.cpp)

    def _fail(self, path: str, message: str) -> SchemaError:
        return SchemaError(f"JSON schema error at {path}: {message}")

    def _resolve(self, ref: Any, path: str) -> Any:
        if not isinstance(ref, str):
            raise self._fail(path, "$ref must be a string")
        if not ref.startswith("#/"):
            raise UnsupportedSchemaError(f"JSON schema error at {path}: unsupported $ref {ref}, "
                                         f"only references into the same document are supported")
        target = self._root
        for sel in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list):
                idx = int(sel) if sel.isdigit() else len(target)
                if idx >= len(target):
                    raise self._fail(path, f"cannot resolve $ref {ref}, {sel} is out of range")
                target = target[idx]
            else:
                raise self._fail(path, f"cannot resolve $ref {ref}, {sel} not found")
        return target

    def _kind(self, schema: Any, path: str) -> tuple[str, Any]:
        """llama.cpp's ``build_node``: the node kind of ``schema`` and what it carries."""
        if not isinstance(schema, dict):
            raise self._fail(path, "schema must be an object")
        check = self._unsupported
        if "$ref" in schema:
            check(schema, {"$ref"}, path)
            return "ref", self._resolve(schema["$ref"], path)
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if "oneOf" in schema else "anyOf"
            check(schema, {key, "type"}, path)
            return "any_of", self._alternatives(schema[key], f"{path}/{key}")
        schema_type = schema.get("type")
        if isinstance(schema_type, list):
            if not schema_type:
                raise self._fail(path, "type must not be empty")
            return "any_of", [({**schema, "type": t}, f"{path}/type/{i}")
                              for i, t in enumerate(schema_type)]
        if "const" in schema:
            check(schema, {"const", "type"}, path)
            return "const", schema["const"]
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise self._fail(path, "enum must be a non-empty array")
            check(schema, {"enum", "type"}, path)
            return "enum", values
        if schema_type is not None and not isinstance(schema_type, str):
            raise self._fail(path, "type must be a string or an array of strings")
        has_properties = "properties" in schema or (
            "additionalProperties" in schema and schema["additionalProperties"] is not True)
        if not schema_type:
            if has_properties:
                return self._object(schema, path)
            if "allOf" in schema:
                check(schema, {"allOf"}, path)
                return "all_of", self._alternatives(schema["allOf"], f"{path}/allOf")
            if "items" in schema or "prefixItems" in schema:
                return self._array(schema, path)
            if ("pattern" in schema or "minLength" in schema or "maxLength" in schema
                    or self._format(schema, path) != "none"):
                return self._string(schema, path)
            check(schema, set(), path)
            return "any", None
        if schema_type == "object":
            if not has_properties and "allOf" in schema:
                check(schema, {"type", "allOf"}, path)
                return "all_of", self._alternatives(schema["allOf"], f"{path}/allOf")
            return self._object(schema, path)
        if schema_type == "string":
            if "allOf" in schema:
                check(schema, {"type", "allOf"}, path)
                return "all_of", self._alternatives(schema["allOf"], f"{path}/allOf")
            return self._string(schema, path)
        if schema_type == "array":
            return self._array(schema, path)
        if schema_type == "integer":
            check(schema, {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
                  path)
            return "integer", _integer_bounds(schema, path)
        if schema_type in ("number", "boolean", "null"):
            check(schema, {"type"}, path)
            return schema_type, None
        raise UnsupportedSchemaError(f"JSON schema error at {path}: unrecognized type "
                                     f"{schema_type}")

    def _alternatives(self, alternatives: Any, path: str) -> list[tuple[Any, str]]:
        if not isinstance(alternatives, list):
            raise self._fail(path, "must be an array of schemas")
        if not alternatives:
            raise self._fail(path, "must not be empty")
        return [(alt, f"{path}/{i}") for i, alt in enumerate(alternatives)]

    def _object(self, schema: dict[str, Any], path: str) -> tuple[str, Any]:
        self._unsupported(schema, {"type", "properties", "required", "additionalProperties"}, path)
        required = set()
        if isinstance(schema.get("required"), list):
            required = {n for n in schema["required"] if isinstance(n, str)}
        properties = []
        if "properties" in schema:
            if not isinstance(schema["properties"], dict):
                raise self._fail(path, "properties must be an object")
            properties = [(n, s, f"{path}/properties/{n}", n in required)
                          for n, s in schema["properties"].items()]
        additional: Any = None   # None: not allowed; True: any value; else a schema
        if "additionalProperties" in schema:
            value = schema["additionalProperties"]
            if isinstance(value, bool):
                additional = True if value else None
            elif isinstance(value, dict):
                additional = (value, f"{path}/additionalProperties")
            else:
                raise self._fail(path, "additionalProperties must be a boolean or a schema")
        elif "properties" not in schema:
            additional = True
        if self.strict:
            missing = sorted(required - {p[0] for p in properties})
            if missing:
                raise UnsupportedSchemaError(f"required properties {missing} at {path} have no "
                                             f"'properties' entry: the grammar cannot produce them")
        return "object", (properties, additional)

    def _array(self, schema: dict[str, Any], path: str) -> tuple[str, Any]:
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"
            items = schema[key]
            if isinstance(items, list):
                self._unsupported(schema, {"type", key} | LlamaCppPythonConverter._tuple_counts(
                    schema, len(items)), path)
                return "tuple", [(item, f"{path}/{key}/{i}") for i, item in enumerate(items)]
            item = (items, f"{path}/{key}")
        else:
            item = ({}, path)
        self._unsupported(schema, {"type", "items", "minItems", "maxItems"}
                          - ({"prefixItems"} if "items" in schema else set())
                          | ({"prefixItems"} if "items" not in schema else set()), path)
        return "array", (item, *_count_range(schema, "minItems", "maxItems", path, -1, cpp=True))

    def _format(self, schema: dict[str, Any], path: str) -> str:
        if "format" not in schema:
            return "none"
        fmt = schema["format"]
        if not isinstance(fmt, str):
            raise self._fail(path, "format must be a string")
        if fmt in ("date", "time", "date-time"):
            return fmt
        if fmt == "uuid" or re.fullmatch(r"uuid[1-5]", fmt):
            return "uuid"
        return "none"

    def _string(self, schema: dict[str, Any], path: str) -> tuple[str, Any]:
        pattern = schema.get("pattern")
        if "pattern" in schema and not isinstance(pattern, str):
            raise self._fail(path, "pattern must be a string")
        fmt = self._format(schema, path)
        min_len, max_len = _count_range(schema, "minLength", "maxLength", path, -1, cpp=True)
        # what the converter honours: the pattern, else the format, else the lengths
        used = {"type"}
        if pattern:
            used.add("pattern")
        elif fmt != "none":
            used.add("format")
        else:
            used |= {"minLength", "maxLength"}
        if not pattern and "pattern" in schema:
            used.add("pattern")   # an empty pattern is no constraint to llama.cpp either
        self._unsupported(schema, used, path)
        return "string", (pattern or "", fmt, min_len, max_len)

    # -- the grammar (json-schema-to-grammar.cpp)

    def visit(self, schema: Any, name: str, path: str = "#") -> str:
        self._enter(path)
        try:
            return self._visit(schema, name, path)
        finally:
            self._leave()

    def _visit(self, schema: Any, name: str, path: str) -> str:
        rule_name = name + "-" if name in self.reserved else name or "root"
        sub_name = _sub(name, "")
        kind, data = self._kind(schema, path)
        if kind == "ref":
            return self._add_rule(rule_name, self._resolve_ref(schema["$ref"], data))
        if kind == "any_of":
            return self._add_rule(rule_name, " | ".join(
                self.visit(alt, f"{name}{'-' if name else 'alternative-'}{i}", where)
                for i, (alt, where) in enumerate(data)))
        if kind == "all_of":
            return self._all_of(data, name, rule_name)
        if kind == "const":
            return self._add_rule(rule_name, self._constant(data))
        if kind == "enum":
            return self._add_rule(rule_name, "(" + " | ".join(self._constant(v) for v in data) + ")")
        if kind == "object":
            properties, additional = data
            if not properties and additional is True:
                return self._add_rule(rule_name, self._add_primitive("object",
                                                                     self.primitives["object"]))
            return self._add_rule(rule_name, self._object_rule(properties, name, additional))
        if kind == "tuple":
            return self._add_rule(rule_name, '"[" space ' + ' "," space '.join(
                self.visit(item, f"{sub_name}tuple-{i}", where)
                for i, (item, where) in enumerate(data)) + ' space "]"')
        if kind == "array":
            (items, where), min_items, max_items = data
            if self._kind(items, where)[0] == "any" and min_items == 0 and max_items < 0:
                return self._primitive(rule_name, "array")
            item_rule = self.visit(items, f"{sub_name}item", where)
            max_items = INT32_MAX if max_items < 0 else max_items
            return self._add_rule(rule_name, '"[" space ' + _repetition_cpp(
                item_rule, min_items, max_items, '"," space') + ' space "]"')
        if kind == "string":
            pattern, fmt, min_len, max_len = data
            if pattern:
                return self._visit_pattern(pattern, rule_name)
            if fmt == "uuid":
                return self._primitive(rule_name, "uuid")
            if fmt != "none":
                prim_name = f"{fmt}-string"
                return self._add_rule(rule_name, self._add_primitive(prim_name,
                                                                     self.formats[prim_name]))
            if min_len > 0 or max_len >= 0:
                char_rule = self._add_primitive("char", self.primitives["char"])
                max_len = INT32_MAX if max_len < 0 else max_len
                return self._add_rule(rule_name, '"\\"" ' + _repetition_cpp(char_rule, min_len,
                                                                            max_len) + ' "\\""')
            return self._primitive(rule_name, "string")
        if kind == "integer":
            low, high = data
            if low == INT64_MIN and high == INT64_MAX:
                return self._primitive(rule_name, "integer")
            return self._add_rule(rule_name, _integer_range(low, high, exact=self.strict))
        if kind in ("number", "boolean", "null"):
            return self._primitive(rule_name, kind)
        return self._add_rule(rule_name, self._add_primitive("value", self.primitives["value"]))

    def _primitive(self, rule_name: str, kind: str) -> str:
        return self._add_primitive("root" if rule_name == "root" else kind, self.primitives[kind])

    def _resolve_ref(self, ref: str, target: Any) -> str:
        fragment = ref[ref.index("#") + 1:] if "#" in ref else ref
        ref_name = "ref" + _INVALID_RULE_CHARS.sub("-", fragment)
        if ref_name not in self._rules and ref not in self._refs_being_resolved:
            self._refs_being_resolved.add(ref)
            ref_name = self.visit(target, ref_name, ref)
            self._refs_being_resolved.discard(ref)
        return ref_name

    def _all_of(self, children: list[tuple[Any, str]], name: str, rule_name: str) -> str:
        required: set[str] = set()
        properties: list[tuple[str, Any, str, bool]] = []
        enum_values: dict[str, int] = {}

        def add(component: Any, where: str, is_required: bool) -> None:
            kind, data = self._kind(component, where)
            if kind == "ref":
                add(data, component["$ref"], is_required)
            elif kind == "object":
                for prop_name, prop_schema, prop_where, _ in data[0]:
                    properties.append((prop_name, prop_schema, prop_where, False))
                    if is_required:
                        required.add(prop_name)
            elif kind == "enum":
                for v in data:
                    literal = self._constant(v)
                    enum_values[literal] = enum_values.get(literal, 0) + 1
            elif self.strict and kind != "any":
                raise UnsupportedSchemaError(f"allOf component at {where} ({kind}) cannot be "
                                             f"merged by the llama.cpp converter")

        for child, where in children:
            kind, data = self._kind(child, where)
            if kind == "any_of":
                for alt, alt_where in data:
                    add(alt, alt_where, False)
            else:
                add(child, where, True)
        if enum_values:
            common = [v for v, count in sorted(enum_values.items(), key=lambda kv: kv[0].encode())
                      if count == len(children)]
            if common:
                return self._add_rule(rule_name, "(" + " | ".join(common) + ")")
        properties = [(n, s, w, n in required) for n, s, w, _ in properties]
        return self._add_rule(rule_name, self._object_rule(properties, name, None))

    def _visit_pattern(self, pattern: str, name: str) -> str:
        snapshot = dict(self._rules)
        try:
            if len(pattern) < 2 or not (pattern.startswith("^") and pattern.endswith("$")):
                raise _UnsupportedPattern("not anchored with '^' and '$'")
            translator = _PatternTranslator(self, pattern, name, cpp=True)
            body = translator.to_rule(translator.transform())
            if translator.depth != 0:
                raise SchemaError("unbalanced parentheses")
            return self._add_rule(name, '"\\"" (' + body + ') "\\""')
        except _UnsupportedPattern as err:
            self._rules = snapshot
            message = f"pattern {pattern} is not supported ({err}), accepting any string"
            if self.strict:
                raise UnsupportedSchemaError(message) from None
            self.warnings.append(message)
            return self._add_rule(name, self._add_primitive("string", self.primitives["string"]))
        except UnsupportedSchemaError:
            raise
        except SchemaError as err:
            self._rules = snapshot
            raise SchemaError(f"JSON schema conversion failed:\nInvalid pattern {pattern}: "
                              f"{err.reason}") from None

    def _object_rule(self, properties: list[tuple[str, Any, str, bool]], name: str,
                     additional: Any) -> str:
        kv_rules: dict[str, str] = {}
        required_props: list[str] = []
        optional_props: list[str] = []
        prop_names: list[str] = []
        for prop_name, prop_schema, where, is_required in properties:
            self._check_property_name(name, prop_name, where)
            prop_rule = self.visit(prop_schema, _sub(name, prop_name), where)
            kv_rules[prop_name] = self._add_rule(
                _sub(name, f"{prop_name}-kv"),
                self._format_literal(self._dump(prop_name)) + ' space ":" space ' + prop_rule)
            (required_props if is_required else optional_props).append(prop_name)
            prop_names.append(prop_name)
        if additional is not None:
            sub_name = _sub(name, "additional")
            if additional is True or self._kind(*additional)[0] == "any":
                value_rule = self._add_primitive("value", self.primitives["value"])
            else:
                value_rule = self.visit(additional[0], f"{sub_name}-value", additional[1])
            key_rule = (self._add_primitive("string", self.primitives["string"]) if not prop_names
                        else self._add_rule(f"{sub_name}-k", self._not_strings(prop_names)))
            kv_rules["*"] = self._add_rule(f"{sub_name}-kv", f'{key_rule} ":" space {value_rule}')
            optional_props.append("*")
        if not required_props and not optional_props:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv_rules[k] for k in required_props)
        if optional_props:
            rule += " ("
            if required_props:
                rule += ' "," space ( '

            def recursive_refs(ks: list[str], first_is_optional: bool) -> str:
                k = ks[0]
                kv_rule = kv_rules[k]
                comma_ref = f'( "," space {kv_rule} )'
                if first_is_optional:
                    res = comma_ref + ("*" if k == "*" else "?")
                else:
                    res = kv_rule + (" " + comma_ref + "*" if k == "*" else "")
                if len(ks) > 1:
                    res += " " + self._add_rule(_sub(name, f"{k}-rest"),
                                                recursive_refs(ks[1:], True))
                return res

            rule += " | ".join(recursive_refs(optional_props[i:], False)
                               for i in range(len(optional_props)))
            if required_props:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def format_grammar(self) -> str:
        return "".join(f"{name} ::= {rule}\n"
                       for name, rule in sorted(self._rules.items(), key=lambda kv: kv[0].encode()))


def _count(schema: Mapping[str, Any], key: str, path: str, default: int | None,
           cpp: bool = False) -> Any:
    """A non-negative integer keyword (minItems, maxLength, ...)."""
    if key not in schema:
        return default
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (
            cpp and value > INT32_MAX):
        raise SchemaError(f"JSON schema error at {path}: {key} must be a non-negative integer")
    return value


def _count_range(schema: Mapping[str, Any], min_key: str, max_key: str, path: str,
                 no_max: int | None, cpp: bool = False) -> tuple[int, Any]:
    """A minimum and maximum count (minItems/maxItems, minLength/maxLength); ``no_max`` when
    there is no maximum. A maximum below the minimum matches nothing: the repetition the
    converters would write does not parse (``{6,5}``), so it is refused here."""
    low = _count(schema, min_key, path, 0, cpp)
    high = _count(schema, max_key, path, no_max, cpp)
    if high is not None and high != no_max and high < low:
        raise SchemaError(f"JSON schema error at {path}: {max_key} {high} is below {min_key} {low}")
    return low, high


def _integer_bounds(schema: Mapping[str, Any], path: str) -> tuple[int, int]:
    """llama.cpp's inclusive integer bounds (fractional bounds rounded inwards, exclusive ones
    folded in); INT64_MIN/INT64_MAX when unbounded."""
    def bound(key: str, round_up: bool) -> int:
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(f"JSON schema error at {path}: {key} must be a number")
        if isinstance(value, int):
            result = value
        else:
            import math
            if not math.isfinite(value):
                raise SchemaError(f"JSON schema error at {path}: {key} must be finite")
            result = math.ceil(value) if round_up else math.floor(value)
        if not INT64_MIN <= result <= INT64_MAX:
            raise UnsupportedSchemaError(f"JSON schema error at {path}: {key} {value} is outside "
                                         f"the 64-bit range")
        return result

    low, high = INT64_MIN, INT64_MAX
    if "minimum" in schema:
        low = bound("minimum", True)
    elif "exclusiveMinimum" in schema:
        low = bound("exclusiveMinimum", False) + 1
    if "maximum" in schema:
        high = bound("maximum", False)
    elif "exclusiveMaximum" in schema:
        high = bound("exclusiveMaximum", True) - 1
    if low > high:
        raise UnsupportedSchemaError(f"JSON schema at {path}: no integer lies between the bounds")
    return low, high


def json_schema_to_gbnf(schema: Mapping[str, Any] | str, *, converter: str = "llama-cpp-python",
                        strict: bool = True, prop_order: list[str] | None = None) -> str:
    """GBNF text for the JSON values ``schema`` describes (see the module docstring).

    Raises
    ------
    UnsupportedSchemaError
        The schema uses something the converter cannot express (strict), or a remote ``$ref``.
    SchemaError
        The schema is malformed (not JSON, not an object, bad keyword values, broken ``$ref``).
    """
    if converter not in CONVERTERS:
        raise ValueError(f"unknown converter {converter!r}; one of {', '.join(CONVERTERS)}")
    try:
        if isinstance(schema, (str, bytes)):
            schema = json.loads(schema)
        else:
            # the conversion rewrites $ref values in place (as llama-cpp-python's does): a copy
            schema = json.loads(json.dumps(schema))
    except ValueError as err:
        raise SchemaError(f"the schema is not JSON: {err}") from None
    except RecursionError:
        raise UnsupportedSchemaError("the schema is nested too deeply to convert") from None
    if not isinstance(schema, dict):
        raise SchemaError(f"a JSON schema is an object, not {type(schema).__name__}")
    try:
        if converter == "llama.cpp":
            if prop_order:
                raise ValueError("prop_order is an option of the llama-cpp-python converter only")
            cpp = LlamaCppConverter(strict, schema)
            cpp.visit(schema, "")
            return cpp.format_grammar()
        py = LlamaCppPythonConverter(strict, {name: i for i, name in enumerate(prop_order or [])})
        schema = py.resolve_refs(schema, "stdin")
        py.visit(schema, "")
        return py.format_grammar()
    except RecursionError:
        raise UnsupportedSchemaError("the schema is nested too deeply to convert") from None
