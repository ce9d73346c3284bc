"""Hypothesis strategies for grammar tests: random GBNF grammars, mutated grammars, and strings
drawn from a grammar (random derivations), so that matching is tested on text that gets deep
into a grammar and not only on text rejected at its first character."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from gguflm.grammar.builtin import JSON_GBNF
from gguflm.grammar.gbnf import (ALT, CHAR, CHAR_ALT, CHAR_ANY, CHAR_NOT, CHAR_RNG_UPPER, END,
                                 RULE_REF, TOKEN, TOKEN_NOT, ParsedGrammar)

# grammars of our own plus llama-cpp-python's bundled ones when installed
SHIPPED_GRAMMARS = [
    JSON_GBNF,
    'root ::= (expr "=" ws term "\\n")+\nexpr ::= term ([-+*/] term)*\n'
    'term ::= ident | num | "(" ws expr ")" ws\nident ::= [a-z] [a-z0-9_]* ws\n'
    'num ::= [0-9]+ ws\nws ::= [ \\t\\n]*\n',
    'root ::= item+\n# no line breaks\nitem ::= "- " [^\\r\\n\\x0b\\x0c\\x85\\u2028\\u2029]+ "\\n"\n',
    'root ::= "yes" | "no" | "maybe" [.!?]{0,3}\n',
    'root ::= [\\U0001F600-\\U0001F64F]{1,3} " " ("é" | "ü" | [ぁ-ゖ]+)\n',
    'root ::= <[10]> (!<[11]>)* <[11]> tail\ntail ::= [a-c]{2,} | \n',
    'root ::= ( [x]* )*\n',
    'root ::= ... "abc" ...\n',
]
try:
    import llama_cpp.llama_grammar as _lg

    SHIPPED_GRAMMARS += [getattr(_lg, n) for n in sorted(dir(_lg)) if n.endswith("_GBNF")]
except ImportError:  # pragma: no cover - llama-cpp-python is an optional peer
    pass

_NAMES = ["a", "b-c", "x1", "expr", "ws", "item"]
_LITERAL_PIECES = ["a", "b", "x", "0", "-", " ", "é", "🔵", "ー", "\\n", '\\"', "\\\\", "\\x41",
                   "\\u00e9", "\\U0001F600", "\\[", "\\]", "\\t", "{", "}"]
_CLASS_PIECES = ["a", "z", "0-9", "a-z", "A-Z", "é", "\\n", "\\]", "\\-", "-", "ぁ-ゖ",
                 "\\x00-\\x1F", "\\u0100-\\uFFFF", "^"]
_SPACES = [" ", "  ", "\t", " # note\n ", "\n  "]


@st.composite
def _item(draw, names: list[str], depth: int) -> str:
    kinds = ["literal", "class", "dot", "ref", "token"] + (["group"] * 2 if depth < 3 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "literal":
        text = '"' + "".join(draw(st.lists(st.sampled_from(_LITERAL_PIECES), min_size=1,
                                                  max_size=4))) + '"'
    elif kind == "class":
        body = "".join(draw(st.lists(st.sampled_from(_CLASS_PIECES), min_size=1, max_size=3)))
        text = "[" + ("^" if draw(st.booleans()) else "") + body + "]"
    elif kind == "dot":
        text = "."
    elif kind == "ref":
        text = draw(st.sampled_from(names + ["undefined-rule"] * (depth == 0 and draw(
            st.integers(0, 20)) == 0)))
    elif kind == "token":
        text = ("!" if draw(st.booleans()) else "") + f"<[{draw(st.integers(0, 40))}]>"
    else:
        text = "(" + draw(_alternatives(names, depth + 1)) + ")"
    suffix = draw(st.sampled_from(["", "", "", "*", "+", "?", "{2}", "{1,}", "{0,3}", "{2,4}",
                                   "{ 1 , 2 }", "{0}"]))
    return text + suffix


@st.composite
def _alternatives(draw, names: list[str], depth: int) -> str:
    n = draw(st.integers(1, 3))
    seqs = []
    for _ in range(n):
        items = draw(st.lists(_item(names, depth), min_size=0 if n > 1 else 1, max_size=4))
        seqs.append(draw(st.sampled_from(_SPACES[:3])).join(items))
    # an empty last alternative would let "|" swallow the line break that ends the rule
    seqs.sort(key=lambda seq: seq != "")
    sep = " | " if depth == 0 else draw(st.sampled_from([" | ", " |\n  ", "|"]))
    return sep.join(seqs)


@st.composite
def grammars(draw) -> str:
    """A random GBNF grammar (mostly valid; sometimes an undefined rule or left recursion)."""
    names = ["root"] + draw(st.lists(st.sampled_from(_NAMES), max_size=4, unique=True))
    rules = [f"{name} ::= {draw(_alternatives(names, 0))}" for name in names]
    order = draw(st.permutations(rules))
    newline = draw(st.sampled_from(["\n", "\r\n", "\n\n# comment\n"]))
    return newline.join(order) + newline


_EDIT_CHARS = list('"[]()|*+?{},:=<>!\\-^.# \n\x00') + ["é", "\xff", "0", "a", "root"]


@st.composite
def mutated(draw) -> bytes:
    """A shipped or random grammar with a few random byte edits."""
    base = draw(st.sampled_from(SHIPPED_GRAMMARS) | grammars()).encode("utf-8")
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        if op == "delete":
            del data[i:i + draw(st.integers(1, 4))]
        elif op == "insert":
            data[i:i] = draw(st.sampled_from(_EDIT_CHARS)).encode("utf-8", "surrogateescape")
        elif op == "replace":
            data[i:i + 1] = draw(st.sampled_from(_EDIT_CHARS)).encode("utf-8")
        else:
            data[i:i] = data[i:i + draw(st.integers(1, 8))]
    return bytes(data)


# -- strings from a grammar


def _class_chars(rule: list[tuple[int, int]], pos: int) -> tuple[bool, list[tuple[int, int]], int]:
    """A char class at pos: (negated, ranges, position after)."""
    negated = rule[pos][0] == CHAR_NOT
    any_char = rule[pos][0] == CHAR_ANY
    ranges = []
    while True:
        kind, value = rule[pos]
        if pos + 1 < len(rule) and rule[pos + 1][0] == CHAR_RNG_UPPER:
            ranges.append((value, rule[pos + 1][1]))
            pos += 2
        else:
            ranges.append((0, 0x10FFFF) if any_char else (value, value))
            pos += 1
        if pos >= len(rule) or rule[pos][0] != CHAR_ALT:
            return negated, ranges, pos


def _pick_char(negated: bool, ranges: list[tuple[int, int]], rng: random.Random) -> int | None:
    if not negated:
        lo, hi = rng.choice(ranges)
        if lo > hi:
            return None
        c = rng.randint(lo, min(hi, lo + 300))
    else:
        for _ in range(20):
            c = rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x3000)])
            if not any(lo <= c <= hi for lo, hi in ranges):
                break
        else:
            return None
    if 0xD800 <= c <= 0xDFFF or c > 0x10FFFF or c == 0:
        return None
    return c


def derive(parsed: ParsedGrammar, root: int, rng: random.Random, budget: int = 60
           ) -> bytes | None:
    """A random string of the grammar from rule ``root`` (tokens as test-grammar-integration's
    ``\\xff`` + id), or None when the walk ran out of budget or hit an impossible class."""
    out = bytearray()
    steps = [0]

    def rule_text(rule_id: int, depth: int) -> bool:
        rule = parsed.rules[rule_id]
        starts = [0] + [i + 1 for i, (k, _) in enumerate(rule) if k == ALT]
        if depth > 12:   # prefer the shortest alternative deep down
            starts.sort(key=lambda s: next(i for i in range(s, len(rule)) if rule[i][0] in (ALT, END)) - s)
            start = starts[0]
        else:
            start = rng.choice(starts)
        pos = start
        while rule[pos][0] not in (ALT, END):
            steps[0] += 1
            if steps[0] > budget * 10:
                return False
            kind, value = rule[pos]
            if kind == RULE_REF:
                if not rule_text(value, depth + 1):
                    return False
                pos += 1
            elif kind in (TOKEN, TOKEN_NOT):
                token = value if kind == TOKEN else (value + 1 + rng.randint(0, 5))
                out.extend(b"\xff" + token.to_bytes(4, "big"))
                pos += 1
            else:
                negated, ranges, pos = _class_chars(rule, pos)
                c = _pick_char(negated, ranges, rng)
                if c is None:
                    return False
                out.extend(chr(c).encode("utf-8"))
            if len(out) > budget * 4:
                return False
        return True

    return bytes(out) if rule_text(root, 0) else None


# -- JSON schemas

_PROP_NAMES = ["a", "b", "name", "age", "tags", "x-y", "é", "with space", "number", "root", ""]
_PATTERNS = ["^[a-z]+$", "^[0-9]{3}-[0-9]{2}$", "^(ab|cd)+x?$", "^\\d+$", "^a.c$", "^[A-Z][a-z]*$",
             "^(\\+|-)?[0-9]{1,3}$"]
_JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000),
                          st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")),
                                  max_size=6))


def _leaf_schemas() -> st.SearchStrategy:
    string = st.fixed_dictionaries({"type": st.just("string")}, optional={
        "minLength": st.integers(0, 3), "maxLength": st.integers(3, 8),
        "description": st.just("a string")})
    formats = st.fixed_dictionaries({"type": st.just("string"), "format": st.sampled_from(
        ["date", "time", "date-time", "uuid", "uuid4"])})
    pattern = st.fixed_dictionaries({"type": st.just("string"),
                                     "pattern": st.sampled_from(_PATTERNS)})
    integer = st.fixed_dictionaries({"type": st.just("integer")}, optional={
        "minimum": st.integers(-300, 300), "maximum": st.integers(300, 5000)})
    exclusive = st.fixed_dictionaries({"type": st.just("integer"),
                                       "exclusiveMinimum": st.integers(-50, 50)})
    simple = st.sampled_from([{"type": t} for t in ("number", "boolean", "null", "string",
                                                    "integer", "object", "array")] +
                             [{}, {"type": ["string", "null"]}, {"type": ["integer", "boolean"]}])
    enum = st.fixed_dictionaries({"enum": st.lists(_JSON_SCALARS, min_size=1, max_size=4,
                                                   unique_by=repr)})
    const = st.fixed_dictionaries({"const": _JSON_SCALARS})
    return st.one_of(string, formats, pattern, integer, exclusive, simple, enum, const)


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    props = st.dictionaries(st.sampled_from(_PROP_NAMES), children, max_size=3)

    @st.composite
    def obj(draw):
        properties = draw(props)
        schema = {"type": "object", "properties": properties}
        names = list(properties)
        if names and draw(st.booleans()):
            schema["required"] = draw(st.lists(st.sampled_from(names), unique=True, min_size=1))
        extra = draw(st.sampled_from(["absent", False, True, "schema"]))
        if extra == "schema":
            schema["additionalProperties"] = draw(children)
        elif extra != "absent":
            schema["additionalProperties"] = extra
        return schema

    array = st.fixed_dictionaries({"type": st.just("array"), "items": children}, optional={
        "minItems": st.integers(0, 2), "maxItems": st.integers(2, 4)})
    tuple_ = st.fixed_dictionaries({"type": st.just("array"),
                                    "prefixItems": st.lists(children, min_size=1, max_size=3)})
    any_of = st.builds(lambda key, alts: {key: alts}, st.sampled_from(["anyOf", "oneOf"]),
                       st.lists(children, min_size=1, max_size=3))
    return st.one_of(obj(), array, tuple_, any_of)


@st.composite
def json_schemas(draw) -> dict:
    """A random JSON schema within (mostly) what the converters support, sometimes with $defs."""
    schema = draw(st.recursive(_leaf_schemas(), _extend, max_leaves=6))
    if draw(st.integers(0, 3)) == 0:
        defs = {"item": draw(st.recursive(_leaf_schemas(), _extend, max_leaves=3))}
        schema = {"$defs": defs, "type": "object",
                  "properties": {"first": {"$ref": "#/$defs/item"}, "rest": schema}}
    return schema
