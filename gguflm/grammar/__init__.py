"""Constrained generation: GBNF grammars with llama.cpp's semantics.

- :class:`Grammar` -- a parsed GBNF grammar (``from_string``, ``from_file``,
  ``from_json_schema``); :class:`GrammarError` is what a bad grammar raises.
- :mod:`gguflm.grammar.gbnf` -- the GBNF parser (llama.cpp's ``llama_grammar_parser``).
- :mod:`gguflm.grammar.json_schema` -- JSON schema -> GBNF, llama-cpp-python's converter or
  llama.cpp's.
- :class:`GrammarSampler` (``gguflm.samplers.Grammar``) and :class:`GrammarChain` -- sampling.
- :class:`LlamaGrammar` -- llama-cpp-python's class of the same name; :mod:`gguflm.grammar.openai`
  -- ``response_format`` and tool calls in OpenAI's shapes.

The matcher itself is ``gguflm._ext.grammar`` (``src/grammar.pyx``, ``src/grammar_engine.h``).
"""

from gguflm.grammar.gbnf import GrammarError
from gguflm.grammar.grammar import CompiledGrammar, Grammar, GrammarState
from gguflm.grammar.json_schema import SchemaError, UnsupportedSchemaError, json_schema_to_gbnf
from gguflm.grammar.sampler import GrammarChain, GrammarSampler, GrammarTrigger
from gguflm.grammar.compat import LlamaGrammar

__all__ = ["Grammar", "GrammarError", "CompiledGrammar", "GrammarState", "SchemaError",
           "UnsupportedSchemaError", "json_schema_to_gbnf", "GrammarSampler", "GrammarChain",
           "GrammarTrigger", "LlamaGrammar"]
