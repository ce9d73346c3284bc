"""A parsed GBNF grammar (:class:`Grammar`) and its matcher over one vocabulary
(:class:`CompiledGrammar`).

>>> grammar = Grammar.from_string('root ::= "yes" | "no"')
>>> compiled = grammar.compile(model.vocab)          # cached per vocabulary
>>> state = compiled.initial_state()
>>> compiled.check(state, token)                      # one token, no mask
>>> state = compiled.accept(state, token)

A :class:`GrammarState` is three integers (the interned set of parse stacks and the unfinished
UTF-8 character), so keeping, copying or comparing states costs nothing; the compiled grammar keeps
the stacks, the transitions met so far and the whole-vocabulary masks computed so far, shared by
every sampler made from it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from gguflm.grammar.gbnf import GrammarError, ParsedGrammar, check_left_recursion, parse

__all__ = ["Grammar", "CompiledGrammar", "GrammarState", "GrammarVocab"]


class GrammarVocab(Protocol):
    """What a grammar needs from a vocabulary (:class:`gguflm.Vocab` has it)."""

    n_tokens: int
    eog_ids: Any

    def token_to_piece(self, tok: int, lstrip: int = 0, special: bool = False) -> bytes: ...

    def tokenize(self, text: str | bytes, add_special: bool = True,
                 parse_special: bool = False) -> list[int]: ...


class GrammarState(NamedTuple):
    """Where a grammar stands: its set of parse stacks (an id) and the unfinished UTF-8
    character of the text so far (llama.cpp's ``partial_utf8``: bits, bytes still expected;
    -1 after an invalid sequence)."""

    stacks: int
    partial_value: int = 0
    partial_remain: int = 0


class Grammar:
    """A GBNF grammar, parsed and checked as llama.cpp checks it when a sampler is made.

    Build one with :meth:`from_string`, :meth:`from_file` or :meth:`from_json_schema`; give it
    to :class:`gguflm.samplers.Grammar`, to ``LLM.complete(..., grammar=)`` or to
    ``create_completion(grammar=)``.

    Attributes
    ----------
    text : str
        The GBNF source.
    root : str
        The start rule.
    """

    __slots__ = ("text", "root", "_parsed", "_named_tokens", "_compiled", "_lock", "__weakref__")

    def __init__(self, text: str, root: str = "root") -> None:
        if not isinstance(text, str):
            raise TypeError(f"grammar text must be a str, not {type(text).__name__}")
        if not isinstance(root, str):
            raise TypeError(f"root must be a str, not {type(root).__name__}")
        self.text = text
        self.root = root
        # <name> tokens need a vocabulary; until one is given, any name stands for one token
        named: list[bytes] = []
        parsed = parse(text, tokenize=lambda name: named.append(name) or [0])
        _check(parsed, root)
        self._parsed = parsed
        self._named_tokens = bool(named)
        self._compiled: weakref.WeakKeyDictionary[Any, CompiledGrammar] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    # -- constructors

    @classmethod
    def from_string(cls, text: str, root: str = "root") -> Grammar:
        """Parse GBNF ``text``.

        Raises
        ------
        GrammarError
            Where llama.cpp rejects the grammar: a parse error (with line and column), an
            undefined rule, left recursion, no ``root`` rule, or no rules at all.
        """
        return cls(text, root)

    @classmethod
    def from_file(cls, path: str | PathLike[str], root: str = "root") -> Grammar:
        """Read a ``.gbnf`` file (UTF-8) and parse it as :meth:`from_string`."""
        return cls(Path(path).read_text(encoding="utf-8"), root)

    @classmethod
    def from_json_schema(cls, schema: Mapping[str, Any] | str, *,
                         converter: str = "llama-cpp-python", strict: bool = True,
                         prop_order: list[str] | None = None) -> Grammar:
        """A grammar for the JSON values ``schema`` describes.

        Parameters
        ----------
        schema
            A JSON schema, as a dict or JSON text.
        converter
            ``"llama-cpp-python"`` (default): the grammar llama-cpp-python 0.3.36's
            ``LlamaGrammar.from_json_schema`` produces (an optional single space between JSON
            tokens); ``"llama.cpp"``: llama.cpp's C++ converter (``json_schema_to_grammar``:
            newlines and indentation allowed).
        strict
            Raise :class:`~gguflm.grammar.json_schema.UnsupportedSchemaError` for schema keywords
            the converter cannot honour (the default), instead of dropping them as the reference
            converters do silently. See :mod:`gguflm.grammar.json_schema`.
        prop_order
            Property names to put first in objects (llama-cpp-python's converter only).
        """
        from gguflm.grammar.json_schema import json_schema_to_gbnf

        return cls(json_schema_to_gbnf(schema, converter=converter, strict=strict,
                                       prop_order=prop_order))

    # -- facts

    @property
    def parsed(self) -> ParsedGrammar:
        """llama.cpp's parse of the text: symbol ids and rules (``<name>`` tokens as id 0 until
        compiled with a vocabulary)."""
        return self._parsed

    def __repr__(self) -> str:
        first = self.text.strip().splitlines()[0] if self.text.strip() else ""
        more = " ..." if len(self.text.strip().splitlines()) > 1 else ""
        return f"Grammar({first[:60]!r}{more}, root={self.root!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Grammar) and (self.text, self.root) == (other.text, other.root)

    def __hash__(self) -> int:
        return hash((self.text, self.root))

    # -- matching

    def compile(self, vocab: GrammarVocab | None = None) -> CompiledGrammar:
        """The matcher of this grammar over ``vocab`` (None: text only, no masks), made once
        per vocabulary and shared.

        Raises
        ------
        GrammarError
            A ``<name>`` token reference does not tokenize to exactly one token of ``vocab``
            (or there is no vocabulary to resolve it).
        """
        key = vocab if vocab is not None else _NO_VOCAB
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = CompiledGrammar(self, vocab)
                self._compiled[key] = compiled
            return compiled


class _NoVocab:
    """Stands for "no vocabulary" as a weak dictionary key."""


_NO_VOCAB = _NoVocab()


def _check(parsed: ParsedGrammar, root: str) -> None:
    """What llama.cpp's ``llama_grammar_init_impl`` checks after parsing."""
    if not parsed.rules:
        raise GrammarError("failed to parse grammar: it has no rules")
    if root not in parsed.symbol_ids:
        raise GrammarError(f"grammar does not contain a '{root}' symbol")
    check_left_recursion(parsed)


class CompiledGrammar:
    """A grammar's matcher over one vocabulary (made by :meth:`Grammar.compile`).

    Thread-safe: calls on one compiled grammar are serialised (and run without the GIL).
    """

    def __init__(self, grammar: Grammar, vocab: GrammarVocab | None) -> None:
        from gguflm._ext import grammar as _engine

        self.grammar = grammar
        self.vocab = vocab
        parsed = grammar.parsed
        if grammar._named_tokens:
            if vocab is None:
                raise GrammarError("the grammar names tokens (<name>): it needs a vocabulary")
            parsed = parse(grammar.text, tokenize=lambda name: vocab.tokenize(
                name, add_special=False, parse_special=True))
        types, values, rule_start = _flatten(parsed.rules)
        self.n_vocab = int(vocab.n_tokens) if vocab is not None else 0
        trie = token_trie(vocab) if vocab is not None else None
        self._engine = _engine.Engine(types, values, rule_start, trie)
        self._start = GrammarState(self._engine.initial(parsed.symbol_ids[grammar.root]))

    def initial_state(self) -> GrammarState:
        """The state before any token (llama.cpp's stacks right after init)."""
        return self._start

    def can_end(self, state: GrammarState) -> bool:
        """Whether the text so far is a complete match (an end-of-generation token is allowed)."""
        return self._engine.has_empty_stack(state.stacks)

    def accept_piece(self, state: GrammarState, token: int, piece: bytes) -> GrammarState:
        """``llama_grammar_accept_token(token, piece)``: the state after ``piece`` (the token id
        counts only where the grammar expects a token, ``<[id]>``).

        Raises
        ------
        GrammarError
            No parse stack survives (llama.cpp throws "Unexpected empty grammar stack").
        """
        stacks, value, remain = self._engine.accept(state.stacks, state.partial_value,
                                                    state.partial_remain, int(token),
                                                    bytes(piece))
        if stacks == 0:
            shown = bytes(piece).decode("utf-8", "replace")
            raise GrammarError(f"Unexpected empty grammar stack after accepting piece: "
                               f"{shown!r} ({token})")
        return GrammarState(stacks, value, remain)

    def accept(self, state: GrammarState, token: int) -> GrammarState:
        """llama.cpp's ``llama_grammar_accept_impl`` for a sampled token.

        Raises
        ------
        GrammarError
            The token is an end-of-generation token where the grammar cannot end (llama.cpp
            aborts), or no stack survives it.
        """
        vocab = self._need_vocab()
        token = int(token)
        if token in vocab.eog_ids:
            if self.can_end(state):
                return state
            raise GrammarError(f"end-of-generation token {token} where the grammar cannot end")
        return self.accept_piece(state, token, vocab.token_to_piece(token, 0, True))

    def check(self, state: GrammarState, token: int) -> bool:
        """Whether ``token`` is allowed in ``state`` (one token checked, no mask)."""
        self._need_vocab()
        return self._engine.check(state.stacks, state.partial_value, state.partial_remain,
                                  int(token))

    def mask(self, state: GrammarState) -> np.ndarray:
        """Allowed tokens in ``state`` as a bool array over the vocabulary (cached per state)."""
        self._need_vocab()
        return self._engine.mask(state.stacks, state.partial_value, state.partial_remain)

    def apply(self, state: GrammarState, ids: np.ndarray | None, logits: np.ndarray,
              full_mask_from: int = -1) -> None:
        """Set the logits of disallowed candidates to -inf in place (llama.cpp's
        ``llama_grammar_apply_impl``). ``ids`` None: candidate i is token i."""
        self._need_vocab()
        if ids is None:
            self._engine.apply(state.stacks, state.partial_value, state.partial_remain,
                               _NO_IDS, logits, True, full_mask_from)
        else:
            self._engine.apply(state.stacks, state.partial_value, state.partial_remain, ids,
                               logits, False, full_mask_from)

    def stats(self) -> dict:
        """Stacks, sets and masks the matcher has met so far."""
        return self._engine.stats()

    def _need_vocab(self) -> GrammarVocab:
        if self.vocab is None:
            raise ValueError("this grammar was compiled without a vocabulary")
        return self.vocab


_NO_IDS = np.zeros(1, dtype=np.int32)


def _flatten(rules: list[list[tuple[int, int]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rules as the engine's flat element arrays and each rule's start position."""
    rule_start = np.zeros(len(rules), dtype=np.int32)
    n = 0
    for i, rule in enumerate(rules):
        rule_start[i] = n
        n += len(rule)
    types = np.empty(n, dtype=np.uint8)
    values = np.empty(n, dtype=np.uint32)
    k = 0
    for rule in rules:
        for kind, value in rule:
            types[k] = kind
            values[k] = value
            k += 1
    return types, values, rule_start


_TRIES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_TRIES_LOCK = threading.Lock()


def token_trie(vocab: GrammarVocab) -> Any:
    """The token trie of ``vocab`` (built once, kept as long as the vocabulary lives)."""
    with _TRIES_LOCK:
        trie = _TRIES.get(vocab)
        if trie is None:
            from gguflm._ext import grammar as _engine

            n = int(vocab.n_tokens)
            pieces = [vocab.token_to_piece(t, 0, True) for t in range(n)]
            eog = np.zeros(n, dtype=np.uint8)
            eog[[t for t in vocab.eog_ids if 0 <= t < n]] = 1
            trie = _engine.TokenTrie(pieces, eog)
            _TRIES[vocab] = trie
        return trie
