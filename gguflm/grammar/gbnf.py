"""The GBNF language, parsed as llama.cpp's ``llama_grammar_parser`` parses it.

The result is llama.cpp's own representation: a symbol table (rule name -> id, generated
``name_N`` rules included) and, per rule id, a flat list of ``(type, value)`` elements ending in
``END``, alternatives separated by ``ALT``. Rule ids, generated names, the element order of
repetitions ``* + ? {m,n}`` and groups, and what is rejected are llama.cpp's, so
:func:`parse` agrees with ``llama_grammar_parser::parse`` element for element.

The parser reads the UTF-8 bytes as llama.cpp reads a C string: text after a NUL byte is ignored
and malformed UTF-8 decodes as llama.cpp's ``decode_utf8`` decodes it. Errors are
:class:`GrammarError` with llama.cpp's wording plus the line and column where parsing stopped.

Where llama.cpp would hang, run out of memory or overflow its stack, this parser stops with a
:class:`GrammarError` instead: a repetition ``{m,n}`` with ``n < m`` (llama.cpp loops generating
rules), more than :data:`MAX_ELEMENTS` elements in all (``"long literal"{2000}`` nested), and
groups nested deeper than :data:`MAX_NESTING`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from gguflm.errors import Error

__all__ = ["GrammarError", "ElementType", "ParsedGrammar", "parse", "check_left_recursion",
           "MAX_REPETITION_THRESHOLD", "MAX_ELEMENTS", "MAX_NESTING"]

#: llama.cpp's cap on repetition counts and on rules multiplied by nested repetitions
MAX_REPETITION_THRESHOLD = 2000
#: elements of all rules together; beyond this a grammar is an attack on memory
MAX_ELEMENTS = 1 << 22
#: nested groups ``( ( ... ) )``; llama.cpp recurses once per level on the C stack
MAX_NESTING = 200

_UINT64_MAX = 2**64 - 1
_UINT32_MAX = 2**32 - 1


class GrammarError(Error, ValueError):
    """A grammar llama.cpp would reject, or one too large or deep to match safely.

    Attributes
    ----------
    reason : str
        What went wrong, in llama.cpp's words where llama.cpp has some.
    line, column : int or None
        1-based position in the grammar text where parsing stopped (column counts characters),
        when the error has a position.
    """

    def __init__(self, reason: str, line: int | None = None, column: int | None = None,
                 context: str = "") -> None:
        self.reason = reason
        self.line = line
        self.column = column
        where = f" at line {line}, column {column}" if line is not None else ""
        snippet = f": {context!r}" if context else ""
        super().__init__(f"{reason}{where}{snippet}")


class ElementType(IntEnum):
    """llama.cpp's ``llama_gretype``."""

    END = 0             # end of a rule
    ALT = 1             # start of another alternative
    RULE_REF = 2        # value: rule id
    CHAR = 3            # value: code point
    CHAR_NOT = 4        # [^...]
    CHAR_RNG_UPPER = 5  # the previous char element is the lower end of a range
    CHAR_ALT = 6        # another char of the same class
    CHAR_ANY = 7        # .
    TOKEN = 8           # <[id]>, value: token id
    TOKEN_NOT = 9       # !<[id]>


END, ALT, RULE_REF, CHAR, CHAR_NOT, CHAR_RNG_UPPER, CHAR_ALT, CHAR_ANY, TOKEN, TOKEN_NOT = (
    int(t) for t in ElementType)

Rule = list[tuple[int, int]]


@dataclass
class ParsedGrammar:
    """llama.cpp's parser state after a successful parse.

    ``symbol_ids`` maps every rule name (defined, referenced or generated) to its id;
    ``rules[id]`` is that rule's elements.
    """

    symbol_ids: dict[str, int]
    rules: list[Rule]
    #: where each rule was defined (byte offset), for error messages
    definitions: dict[int, int] = field(default_factory=dict, repr=False)
    #: the text parsed (up to a NUL byte)
    text: bytes = field(default=b"", repr=False)

    def rule_name(self, rule_id: int) -> str:
        """The name llama.cpp prints for ``rule_id`` (the first in name order, as its std::map)."""
        for name in sorted(self.symbol_ids, key=lambda n: n.encode("utf-8", "surrogateescape")):
            if self.symbol_ids[name] == rule_id:
                return name
        return f"#{rule_id}"


# ---------------------------------------------------------------------------------------------
# scanning helpers over a NUL-terminated byte string (llama.cpp's const char *)


def _is_digit(c: int) -> bool:
    return 48 <= c <= 57


def _is_word_char(c: int) -> bool:
    return 97 <= c <= 122 or 65 <= c <= 90 or c == 45 or 48 <= c <= 57


_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)  # by the lead byte's high nibble


class _Parser:
    """``llama_grammar_parser``: one object per parse."""

    def __init__(self, text: bytes, tokenize: Callable[[bytes], list[int]] | None) -> None:
        cut = text.find(b"\0")
        self.text = text if cut < 0 else text[:cut]
        self.src = self.text + b"\0\0\0\0\0\0\0\0\0\0"  # C reads stop at the first NUL
        self.tokenize = tokenize
        self.symbol_ids: dict[str, int] = {}
        self.rules: list[Rule] = []
        self.ref_positions: dict[int, int] = {}
        self.definitions: dict[int, int] = {}
        self.n_elements = 0
        self.depth = 0

    # -- errors

    def error(self, reason: str, pos: int | None, show_rest: bool = True) -> GrammarError:
        if pos is None:
            return GrammarError(reason)
        line, column = _line_column(self.text, pos)
        rest = self.text[pos:pos + 40].decode("utf-8", "replace") if show_rest else ""
        return GrammarError(reason, line, column, rest)

    # -- lexical pieces

    def parse_space(self, pos: int, newline_ok: bool) -> int:
        src = self.src
        while True:
            c = src[pos]
            if c == 32 or c == 9 or c == 35 or (newline_ok and (c == 13 or c == 10)):
                if c == 35:  # '#': a comment runs to the end of the line
                    while src[pos] and src[pos] not in (13, 10):
                        pos += 1
                else:
                    pos += 1
            else:
                return pos

    def parse_name(self, pos: int) -> int:
        start = pos
        while _is_word_char(self.src[pos]):
            pos += 1
        if pos == start:
            raise self.error("expecting name", start)
        return pos

    def parse_int(self, pos: int) -> int:
        start = pos
        while _is_digit(self.src[pos]):
            pos += 1
        if pos == start:
            raise self.error("expecting integer", start)
        return pos

    def parse_hex(self, pos: int, size: int) -> tuple[int, int]:
        src, start, end, value = self.src, pos, pos + size, 0
        while pos < end and src[pos]:
            c = src[pos]
            if 97 <= c <= 102:
                digit = c - 87
            elif 65 <= c <= 70:
                digit = c - 55
            elif 48 <= c <= 57:
                digit = c - 48
            else:
                break
            value = ((value << 4) + digit) & _UINT32_MAX
            pos += 1
        if pos != end:
            raise self.error(f"expecting {size} hex chars", start)
        return value, pos

    def decode_utf8(self, pos: int) -> tuple[int, int]:
        """llama.cpp's grammar-text ``decode_utf8``: no validation, stops at NUL."""
        src = self.src
        first = src[pos]
        length = _UTF8_LEN[first >> 4]
        value = first & ((1 << (8 - length)) - 1)
        end = pos + length
        pos += 1
        while pos < end and src[pos]:
            value = (value << 6) + (src[pos] & 0x3F)
            pos += 1
        return value, pos

    def parse_char(self, pos: int) -> tuple[int, int]:
        src = self.src
        if src[pos] == 92:  # backslash
            e = src[pos + 1]
            if e == 120:  # x
                return self.parse_hex(pos + 2, 2)
            if e == 117:  # u
                return self.parse_hex(pos + 2, 4)
            if e == 85:  # U
                return self.parse_hex(pos + 2, 8)
            if e == 116:
                return 9, pos + 2
            if e == 114:
                return 13, pos + 2
            if e == 110:
                return 10, pos + 2
            if e in (92, 34, 91, 93, 45):  # \ " [ ] -
                return e, pos + 2
            raise self.error("unknown escape", pos)
        if src[pos]:
            return self.decode_utf8(pos)
        raise self.error("unexpected end of input", pos, show_rest=False)

    def parse_token(self, pos: int) -> tuple[int, int]:
        src, start = self.src, pos
        if src[pos] != 60:
            raise self.error("expecting '<'", pos)
        pos += 1
        if src[pos] == 91:  # <[id]>
            pos += 1
            int_end = self.parse_int(pos)
            token_id = self.stoull(pos, int_end)
            if token_id > _UINT32_MAX:
                raise self.error("parsed token id is too big", pos)
            pos = int_end
            if src[pos] != 93:
                raise self.error("expecting ']'", pos)
            pos += 1
            if src[pos] != 62:
                raise self.error("expecting '>'", pos)
            return token_id, pos + 1
        if self.tokenize is None:
            raise self.error("no vocab to parse token", start)
        while src[pos] and src[pos] != 62:
            pos += 1
        if src[pos] != 62:
            raise self.error("expecting '>'", pos)
        pos += 1
        tokens = self.tokenize(bytes(self.src[start:pos]))
        if len(tokens) != 1:  # must be exactly one token
            text = self.src[start:pos].decode("utf-8", "replace")
            raise self.error(f"invalid token '{text}'", start, show_rest=False)
        return int(tokens[0]), pos

    # -- symbols and rules

    def get_symbol_id(self, name: bytes) -> int:
        key = name.decode("utf-8", "surrogateescape")
        return self.symbol_ids.setdefault(key, len(self.symbol_ids))

    def generate_symbol_id(self, base_name: str) -> int:
        next_id = len(self.symbol_ids)
        # llama.cpp assigns, so a clash with an existing name re-points that name
        self.symbol_ids[f"{base_name}_{next_id}"] = next_id
        return next_id

    def add_rule(self, rule_id: int, rule: Rule) -> None:
        if len(self.rules) <= rule_id:
            self.rules.extend([] for _ in range(rule_id + 1 - len(self.rules)))
        self.n_elements += len(rule)
        if self.n_elements > MAX_ELEMENTS:
            raise GrammarError(f"grammar too large: more than {MAX_ELEMENTS} elements")
        self.rules[rule_id] = rule

    # -- the grammar

    def parse_alternates(self, pos: int, rule_name: str, rule_id: int, is_nested: bool) -> int:
        rule: Rule = []
        pos = self.parse_sequence(pos, rule_name, rule, is_nested)
        while self.src[pos] == 124:  # |
            rule.append((ALT, 0))
            pos = self.parse_space(pos + 1, True)
            pos = self.parse_sequence(pos, rule_name, rule, is_nested)
        rule.append((END, 0))
        self.add_rule(rule_id, rule)
        return pos

    def parse_sequence(self, pos: int, rule_name: str, rule: Rule, is_nested: bool) -> int:
        src = self.src
        state = [len(rule), 1]  # last_sym_start, n_prev_rules

        def repeat(min_times: int, max_times: int | None) -> None:
            self.handle_repetitions(rule, rule_name, state, min_times, max_times, pos)

        while src[pos]:
            c = src[pos]
            if c == 34:  # "literal"
                pos += 1
                state[:] = [len(rule), 1]
                while src[pos] != 34:
                    if not src[pos]:
                        raise self.error("unexpected end of input", pos, show_rest=False)
                    value, pos = self.parse_char(pos)
                    rule.append((CHAR, value))
                self.count(rule)
                pos = self.parse_space(pos + 1, is_nested)
            elif c == 91:  # [char class]
                pos += 1
                start_type = CHAR
                if src[pos] == 94:  # ^
                    pos += 1
                    start_type = CHAR_NOT
                state[:] = [len(rule), 1]
                while src[pos] != 93:
                    if not src[pos]:
                        raise self.error("unexpected end of input", pos, show_rest=False)
                    value, pos = self.parse_char(pos)
                    rule.append((CHAR_ALT if state[0] < len(rule) else start_type, value))
                    if src[pos] == 45 and src[pos + 1] != 93:  # a-b
                        if not src[pos + 1]:
                            raise self.error("unexpected end of input", pos + 1, show_rest=False)
                        value, pos = self.parse_char(pos + 1)
                        rule.append((CHAR_RNG_UPPER, value))
                self.count(rule)
                pos = self.parse_space(pos + 1, is_nested)
            elif c == 60 or c == 33:  # <token> or !<token>
                kind = TOKEN
                if c == 33:
                    kind = TOKEN_NOT
                    pos += 1
                token_id, token_end = self.parse_token(pos)
                state[:] = [len(rule), 1]
                rule.append((kind, token_id))
                pos = self.parse_space(token_end, is_nested)
            elif _is_word_char(c):  # rule reference
                name_end = self.parse_name(pos)
                ref_id = self.get_symbol_id(src[pos:name_end])
                self.ref_positions.setdefault(ref_id, pos)
                pos = self.parse_space(name_end, is_nested)
                state[:] = [len(rule), 1]
                rule.append((RULE_REF, ref_id))
            elif c == 40:  # ( group )
                self.depth += 1
                if self.depth > MAX_NESTING:
                    raise self.error(f"groups nested deeper than {MAX_NESTING}", pos)
                pos = self.parse_space(pos + 1, True)
                n_rules_before = len(self.symbol_ids)
                sub_rule_id = self.generate_symbol_id(rule_name)
                pos = self.parse_alternates(pos, rule_name, sub_rule_id, True)
                self.depth -= 1
                state[:] = [len(rule), max(1, len(self.symbol_ids) - n_rules_before)]
                rule.append((RULE_REF, sub_rule_id))
                if src[pos] != 41:
                    raise self.error("expecting ')'", pos)
                pos = self.parse_space(pos + 1, is_nested)
            elif c == 46:  # . any char
                state[:] = [len(rule), 1]
                rule.append((CHAR_ANY, 0))
                pos = self.parse_space(pos + 1, is_nested)
            elif c == 42:  # *
                pos = self.parse_space(pos + 1, is_nested)
                repeat(0, None)
            elif c == 43:  # +
                pos = self.parse_space(pos + 1, is_nested)
                repeat(1, None)
            elif c == 63:  # ?
                pos = self.parse_space(pos + 1, is_nested)
                repeat(0, 1)
            elif c == 123:  # {m}, {m,}, {m,n}
                pos = self.parse_space(pos + 1, is_nested)
                if not _is_digit(src[pos]):
                    raise self.error("expecting an int", pos)
                int_end = self.parse_int(pos)
                min_times = self.stoull(pos, int_end)
                pos = self.parse_space(int_end, is_nested)
                max_times: int | None = None  # no maximum
                if src[pos] == 125:  # }
                    max_times = min_times
                    pos = self.parse_space(pos + 1, is_nested)
                elif src[pos] == 44:  # ,
                    pos = self.parse_space(pos + 1, is_nested)
                    if _is_digit(src[pos]):
                        int_end = self.parse_int(pos)
                        max_times = self.stoull(pos, int_end)
                        pos = self.parse_space(int_end, is_nested)
                    if src[pos] != 125:
                        raise self.error("expecting '}'", pos)
                    pos = self.parse_space(pos + 1, is_nested)
                else:
                    raise self.error("expecting ','", pos)
                if min_times > MAX_REPETITION_THRESHOLD:
                    raise self.error("number of repetitions exceeds sane defaults, please "
                                     "reduce the number of repetitions", pos, show_rest=False)
                if max_times is not None and max_times > MAX_REPETITION_THRESHOLD:
                    max_times = None  # llama.cpp: a large maximum means no maximum
                repeat(min_times, max_times)
            else:
                break
        return pos

    def stoull(self, start: int, end: int) -> int:
        """std::stoull of the digits in [start, end): out of range is an error."""
        digits = self.src[start:end].lstrip(b"0")
        value = int(digits) if digits and len(digits) <= 20 else (0 if not digits else 1 << 64)
        if value > _UINT64_MAX:
            raise self.error("integer out of range", start)
        return value

    def count(self, rule: Rule) -> None:
        """Literals and classes grow a rule without add_rule; keep the size bound honest."""
        if self.n_elements + len(rule) > MAX_ELEMENTS:
            raise GrammarError(f"grammar too large: more than {MAX_ELEMENTS} elements")

    def handle_repetitions(self, rule: Rule, rule_name: str, state: list[int], min_times: int,
                           max_times: int | None, pos: int) -> None:
        """Rewrite the last item S of ``rule`` for S{min,max} as llama.cpp does::

            S{m,n} -> S (m times) S'(n-m),  S'(x) ::= S S'(x-1) |,  S'(1) ::= S |
            S{m,}  -> S (m times) S',       S'    ::= S S' |
        """
        last_sym_start, n_prev_rules = state
        if last_sym_start == len(rule):
            raise self.error("expecting preceding item to */+/?/{", pos)
        no_max = max_times is None
        if not no_max and max_times < min_times:
            # llama.cpp computes n - m in unsigned arithmetic and loops until memory runs out
            raise self.error(f"repetition {{{min_times},{max_times}}}: the maximum is below the "
                             f"minimum", pos, show_rest=False)
        prev_rule = rule[last_sym_start:]
        total_rules = 1
        if not no_max and max_times > 0:
            total_rules = max_times
        elif min_times > 0:
            total_rules = min_times
        if n_prev_rules * total_rules > MAX_REPETITION_THRESHOLD:
            raise self.error("number of rules that are going to be repeated multiplied by the new "
                             "repetition exceeds sane defaults, please reduce the number of "
                             "repetitions or rule complexity", pos, show_rest=False)
        if self.n_elements + len(rule) + len(prev_rule) * max(min_times, 1) > MAX_ELEMENTS:
            raise GrammarError(f"grammar too large: more than {MAX_ELEMENTS} elements")
        if min_times == 0:
            del rule[last_sym_start:]
        else:
            rule.extend(prev_rule * (min_times - 1))
        n_opt = 1 if no_max else max_times - min_times
        last_rec_rule_id = 0
        for i in range(n_opt):
            rec_rule = list(prev_rule)
            rec_rule_id = self.generate_symbol_id(rule_name)
            if i > 0 or no_max:
                rec_rule.append((RULE_REF, rec_rule_id if no_max else last_rec_rule_id))
            rec_rule.append((ALT, 0))
            rec_rule.append((END, 0))
            self.add_rule(rec_rule_id, rec_rule)
            last_rec_rule_id = rec_rule_id
        if n_opt > 0:
            rule.append((RULE_REF, last_rec_rule_id))
        state[1] = n_prev_rules * total_rules

    def parse_rule(self, pos: int) -> int:
        src = self.src
        name_end = self.parse_name(pos)
        after_name = self.parse_space(name_end, False)
        name = src[pos:name_end]
        rule_id = self.get_symbol_id(name)
        self.definitions[rule_id] = pos
        if not (src[after_name] == 58 and src[after_name + 1] == 58 and src[after_name + 2] == 61):
            raise self.error("expecting ::=", after_name)
        pos = self.parse_space(after_name + 3, True)
        pos = self.parse_alternates(pos, name.decode("utf-8", "surrogateescape"), rule_id, False)
        if src[pos] == 13:
            pos += 2 if src[pos + 1] == 10 else 1
        elif src[pos] == 10:
            pos += 1
        elif src[pos]:
            raise self.error("expecting newline or end", pos)
        return self.parse_space(pos, True)

    def parse(self) -> ParsedGrammar:
        pos = self.parse_space(0, True)
        while self.src[pos]:
            pos = self.parse_rule(pos)
        # every rule used must be defined (llama.cpp checks rules in id order)
        for rule_id, rule in enumerate(self.rules):
            if not rule:
                raise self.undefined(rule_id)
            for kind, value in rule:
                if kind == RULE_REF and (value >= len(self.rules) or not self.rules[value]):
                    raise self.undefined(value)
        return ParsedGrammar(self.symbol_ids, self.rules, self.definitions, self.text)

    def undefined(self, rule_id: int) -> GrammarError:
        name = ParsedGrammar(self.symbol_ids, self.rules).rule_name(rule_id)
        return self.error(f"Undefined rule identifier '{name}'", self.ref_positions.get(rule_id),
                          show_rest=False)


def _line_column(text: bytes, pos: int) -> tuple[int, int]:
    pos = min(pos, len(text))
    line_start = max(text.rfind(b"\n", 0, pos), text.rfind(b"\r", 0, pos)) + 1
    line = text.count(b"\n", 0, pos) + 1
    column = len(text[line_start:pos].decode("utf-8", "replace")) + 1
    return line, column


def parse(text: str | bytes, tokenize: Callable[[bytes], list[int]] | None = None
          ) -> ParsedGrammar:
    """Parse GBNF ``text`` as ``llama_grammar_parser::parse`` does.

    Parameters
    ----------
    text
        The grammar (str, or UTF-8 bytes; a NUL byte ends it as it ends a C string).
    tokenize
        ``<name>`` token references are resolved by this function (bytes of ``<name>`` ->
        token ids, as llama.cpp's ``tokenize(..., add_special=false, parse_special=true)``);
        without it they are an error, as in llama.cpp without a vocabulary. ``<[id]>`` needs
        nothing.

    Raises
    ------
    GrammarError
        Where llama.cpp's parser fails (its message), with the line and column.
    """
    if isinstance(text, str):
        try:
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as exc:   # a lone surrogate (JSON's "\ud800"): no UTF-8 for it
            raise GrammarError(f"the grammar holds a lone surrogate U+{ord(exc.object[exc.start]):04X} "
                               f"at character {exc.start}, which UTF-8 cannot encode") from None
    elif isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text)
    else:
        raise TypeError(f"a grammar is str or bytes, not {type(text).__name__}")
    return _Parser(data, tokenize).parse()


def check_left_recursion(parsed: ParsedGrammar) -> None:
    """llama.cpp's ``llama_grammar_detect_left_recursion`` over every rule, without recursion.

    A rule may be empty only through an empty alternative of its own (as llama.cpp computes it);
    a rule is left-recursive when it can reach itself through leftmost references, skipping over
    references to rules that may be empty.

    Raises
    ------
    GrammarError
        Naming the rule llama.cpp names (by index) and where it is defined.
    """
    rules = parsed.rules
    n = len(rules)
    visited = [False] * n
    in_progress = [False] * n
    may_be_empty = [False] * n
    for start in range(n):
        if visited[start]:
            continue
        if _detect(rules, start, visited, in_progress, may_be_empty):
            name = parsed.rule_name(start)
            pos = parsed.definitions.get(start)
            line, column = (None, None) if pos is None else _line_column(parsed.text, pos)
            raise GrammarError(f"unsupported grammar, left recursion detected for nonterminal "
                               f"'{name}' (index {start})", line, column)


def _detect(rules: list[Rule], start: int, visited: list[bool], in_progress: list[bool],
            may_be_empty: list[bool]) -> bool:
    """One top-level call of the recursive detector, with an explicit stack of frames
    ``[rule index, element index, recurse_into_nonterminal]``.

    llama.cpp enters a rule again every time it is referenced, which takes exponential time on
    some grammars; a rule already finished cannot lead to a cycle that was not found then, so
    it is not entered again (same answer, same rule named).
    """
    if in_progress[start]:
        return True
    frames: list[list[int]] = []

    def enter(index: int) -> None:
        in_progress[index] = True
        at_rule_start = True
        for kind, _ in rules[index]:
            if kind in (END, ALT):
                if at_rule_start:
                    may_be_empty[index] = True
                    break
                at_rule_start = True
            else:
                at_rule_start = False
        frames.append([index, 0, 1])

    enter(start)
    while frames:
        frame = frames[-1]
        index, i, recurse = frame
        rule = rules[index]
        if i >= len(rule):
            in_progress[index] = False
            visited[index] = True
            frames.pop()
            if frames:  # back in the caller, right after its recursive call
                caller = frames[-1]
                ref = rules[caller[0]][caller[1]][1]
                if not may_be_empty[ref]:
                    caller[2] = 0
                caller[1] += 1
            continue
        kind, value = rule[i]
        if kind == RULE_REF and recurse:
            if in_progress[value]:
                return True
            if not visited[value]:
                enter(value)
                continue
            frame[2] = 1 if may_be_empty[value] else 0
            frame[1] = i + 1
            continue
        frame[2] = 1 if kind in (END, ALT) else 0
        frame[1] = i + 1
    return False
