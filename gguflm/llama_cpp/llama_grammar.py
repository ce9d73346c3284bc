"""llama-cpp-python's grammar module (``llama_cpp.llama_grammar``): ``LlamaGrammar``, the JSON
grammar it ships and its JSON-schema converter (gguflm's own, :mod:`gguflm.grammar.json_schema`,
with llama-cpp-python's rules)."""

from __future__ import annotations

from gguflm.grammar.compat import JSON_GBNF, LLAMA_GRAMMAR_DEFAULT_ROOT, LlamaGrammar
from gguflm.grammar.json_schema import json_schema_to_gbnf as _convert

__all__ = ["LlamaGrammar", "JSON_GBNF", "LLAMA_GRAMMAR_DEFAULT_ROOT", "json_schema_to_gbnf"]


def json_schema_to_gbnf(schema: str, prop_order: list[str] | None = None) -> str:
    """GBNF for the JSON values ``schema`` (JSON text) describes, as llama-cpp-python converts it."""
    return _convert(schema, converter="llama-cpp-python", prop_order=prop_order)

