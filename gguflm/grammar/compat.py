"""llama-cpp-python's ``LlamaGrammar``, for code written against it: the same classmethods,
building a :class:`gguflm.Grammar` (so it goes wherever a grammar goes)."""

from __future__ import annotations

from os import PathLike
from pathlib import Path
from typing import Any

from gguflm.grammar.builtin import JSON_GBNF
from gguflm.grammar.grammar import Grammar
from gguflm.grammar.json_schema import json_schema_to_gbnf

__all__ = ["LlamaGrammar", "JSON_GBNF", "LLAMA_GRAMMAR_DEFAULT_ROOT"]

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"


class LlamaGrammar(Grammar):
    """``llama_cpp.LlamaGrammar``: ``from_string``, ``from_file``, ``from_json_schema``
    (``verbose`` is accepted and ignored; the grammar is parsed and checked at once, so errors
    come as :class:`gguflm.GrammarError` here rather than when sampling starts)."""

    __slots__ = ()

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:  # type: ignore[override]
        return cls(grammar, LLAMA_GRAMMAR_DEFAULT_ROOT)

    @classmethod
    def from_file(cls, file: str | PathLike[str], verbose: bool = True) -> LlamaGrammar:  # type: ignore[override]
        text = Path(file).read_text(encoding="utf-8")
        if not text:
            raise ValueError(f"from_file: error parsing grammar file: {file} is empty")
        return cls.from_string(text, verbose=verbose)

    @classmethod
    def from_json_schema(cls, json_schema: str | Any, verbose: bool = True) -> LlamaGrammar:  # type: ignore[override]
        return cls.from_string(json_schema_to_gbnf(json_schema), verbose=verbose)

    # llama-cpp-python's attribute names
    @property
    def _grammar(self) -> str:
        return self.text

    @property
    def _root(self) -> str:
        return self.root
