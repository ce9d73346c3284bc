"""Write llama.cpp's grammar test cases as JSON, from its test sources.

    python extract_llama_cpp_tests.py LLAMA_CPP_DIR

reads ``tests/test-grammar-parser.cpp``, ``tests/test-grammar-integration.cpp`` and
``tests/test-json-schema-to-grammar.cpp`` of a llama.cpp checkout (the one vendored in
llama-cpp-python 0.3.36 for the files here) and writes ``parser.json``, ``integration.json``
and ``json_schema_to_grammar.json`` beside this script. Only the data is taken: grammars,
schemas, strings, expected symbol tables, rules and grammars; the tests that use them are ours.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# C++ string pieces: raw strings R"""(...)""", ordinary "..." literals, token(N) calls
_PIECE = re.compile(r'R"""\((.*?)\)"""|"((?:[^"\\]|\\.)*)"|token\((\d+)\)', re.S)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
_TYPES = {"END": 0, "ALT": 1, "RULE_REF": 2, "CHAR": 3, "CHAR_NOT": 4, "CHAR_RNG_UPPER": 5,
          "CHAR_ALT": 6, "CHAR_ANY": 7, "TOKEN": 8, "TOKEN_NOT": 9}


def c_unescape(text: str) -> bytes:
    """A C++ string literal's bytes (\\xNN, \\n, ...; UTF-8 source text)."""
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        e = text[i + 1]
        if e == "x":
            m = re.match(r"[0-9a-fA-F]+", text[i + 2:])
            out.append(int(m.group(0), 16) & 0xFF)
            i += 2 + len(m.group(0))
        else:
            out += _SIMPLE_ESCAPES[e].encode()
            i += 2
    return bytes(out)


def string_expr(text: str) -> bytes:
    """Value of a C++ expression concatenating string pieces with + (and token(N) calls)."""
    out = b""
    for raw, literal, token in _PIECE.findall(text):
        if token:
            out += b"\xff" + int(token).to_bytes(4, "big")
        elif raw or not literal and not token and raw == "":
            out += raw.encode("utf-8")
        else:
            out += c_unescape(literal)
    return out


def split_top(text: str) -> list[str]:
    """Top-level comma-separated items of a brace-delimited C++ initializer list body."""
    items, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if text.startswith('R"""(', i):
            i = text.index(')"""', i) + 4
            continue
        if c in "\"'":   # a string or char literal: its brackets do not count
            i += 1
            while text[i] != c:
                i += 2 if text[i] == "\\" else 1
        elif c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        i += 1
    if text[start:].strip():
        items.append(text[start:])
    return [s.strip() for s in items if s.strip() and not s.strip().startswith("//")]


def braced(text: str, start: int) -> tuple[str, int]:
    """The body of the {...} starting at text[start] == '{', and the index after it."""
    depth, i = 0, start
    while True:
        if text.startswith('R"""(', i):
            i = text.index(')"""', i) + 4
            continue
        c = text[i]
        if c in "\"'":
            i += 1
            while text[i] != c:
                i += 2 if text[i] == "\\" else 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
        i += 1


def strip_comments(text: str) -> str:
    return re.sub(r"^\s*//.*$", "", text, flags=re.M)


def char_value(text: str) -> int:
    text = text.strip()
    if text.startswith("'"):
        return c_unescape(text[1:-1])[0]
    return int(text.split("*/")[-1].strip())


def parser_cases(src: str) -> dict:
    src = strip_comments(src[src.index("int main"):])
    failures = [string_expr(m.group(1)).decode() for m in
                re.finditer(r"verify_failure\((R\"\"\"\(.*?\)\"\"\")\);", src, re.S)]
    cases = []
    for m in re.finditer(r"verify_parsing\(", src):
        grammar_m = re.compile(r'R"""\((.*?)\)"""', re.S).match(src, m.end())
        symbols_body, after = braced(src, src.index("{", grammar_m.end()))
        rules_body, _ = braced(src, src.index("{", after))
        symbols = {}
        for item in split_top(symbols_body):
            name, value = re.match(r'\{"([^"]*)",\s*(\d+)\}', item).groups()
            symbols[name] = int(value)
        elements = []
        for item in split_top(rules_body):
            kind, value = re.match(r"\{LLAMA_GRETYPE_(\w+),\s*(.*)\}", item, re.S).groups()
            elements.append([_TYPES[kind], char_value(value)])
        cases.append({"grammar": grammar_m.group(1), "symbols": symbols, "elements": elements})
    return {"failures": failures, "parses": cases}


def integration_cases(src: str) -> dict:
    src = strip_comments(src[src.index("static void test_simple_grammar"):])
    cases = []
    for m in re.finditer(r"\btest_(grammar|schema)\(", src):
        body, _ = braced("{" + src[m.end():], 0)
        parts = split_top(body)
        passing = [string_expr(s).decode("latin-1") for s in split_top(braced(parts[2], 0)[0])]
        failing = [string_expr(s).decode("latin-1") for s in split_top(braced(parts[3], 0)[0])]
        cases.append({"kind": m.group(1), "name": string_expr(parts[0]).decode(),
                      "source": string_expr(parts[1]).decode(),
                      "passing": passing, "failing": failing})
    fails = [string_expr(s).decode() for s in re.findall(
        r'const std::string \w+ = (R"""\((?:(?!\)""").)*\)""");\s*assert\(test_build_grammar_fails',
        src, re.S)]
    return {"cases": cases, "build_failures": fails}


def schema_cases(src: str) -> list[dict]:
    src = strip_comments(src[src.index("static void test_all"):src.index("int main")])
    cases = []
    for m in re.finditer(r"\btest\(\{", src):
        body, _ = braced(src, m.end() - 1)
        parts = split_top(body)
        status, name, schema, grammar = parts[:4]
        cases.append({"status": status, "name": string_expr(name).decode(),
                      "schema": string_expr(schema).decode(),
                      "grammar": string_expr(grammar).decode()})
    return cases


def main(llama_cpp: Path) -> None:
    tests = llama_cpp / "tests"
    # the integration test's strings hold raw bytes (token markers 0xff): stored as latin-1 text
    outputs = {
        "parser.json": parser_cases((tests / "test-grammar-parser.cpp").read_text()),
        "integration.json": integration_cases((tests / "test-grammar-integration.cpp").read_text()),
        "json_schema_to_grammar.json": schema_cases(
            (tests / "test-json-schema-to-grammar.cpp").read_text()),
    }
    for name, data in outputs.items():
        (HERE / name).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(name, {k: len(v) for k, v in data.items()} if isinstance(data, dict) else len(data))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
