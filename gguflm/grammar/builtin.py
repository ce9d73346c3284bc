"""Grammars that ship with the reference: what ``response_format={"type": "json_object"}`` uses.

``JSON_GBNF`` is llama.cpp's ``grammars/json.gbnf`` (llama-cpp-python's ``JSON_GBNF``): any JSON
object, strings without control characters, at most one newline plus 20 blanks between tokens.
Same rules in the same order, so the same rule ids and the same constrained outputs.
"""

JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""
