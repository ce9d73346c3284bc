"""Grammars from API clients: GBNF text, JSON schemas (both converters), and the matcher fed
random token sequences.

Must hold: a :class:`gguflm.Error` (GrammarError, SchemaError) or a result that is valid: a
parsed and compiled grammar; converter output that parses as GBNF (for schemas whose strings are
Unicode text: a lone surrogate has no UTF-8 form, so then only a GrammarError); a matcher whose mask agrees
with its single-token check and that accepts every token it allows.
"""

from __future__ import annotations

import re

import numpy as np

from gguflm.errors import Error
from gguflm.grammar import Grammar
from gguflm.grammar.json_schema import json_schema_to_gbnf
from gguflm.vocab import Vocab

from . import Check


# UTF-8's encoding of a surrogate (ED A0..BF 80..BF) as surrogateescape leaves it
_ENCODED_SURROGATE = re.compile("\udced([\udca0-\udcbf])([\udc80-\udcbf])")


def text_of(data: bytes) -> str:
    """Bytes as the str an API client can send (JSON strings may hold any code point, lone
    surrogates included): UTF-8 where valid, a surrogate's 3-byte encoding as that surrogate,
    each other invalid byte as surrogateescape's U+DC80..U+DCFF."""
    text = data.decode("utf-8", "surrogateescape")
    return _ENCODED_SURROGATE.sub(
        lambda m: chr(0xD000 | (ord(m[1]) & 0x3F) << 6 | (ord(m[2]) & 0x3F)), text)


def gbnf() -> Check:
    def check(data: bytes) -> None:
        try:
            grammar = Grammar.from_string(text_of(data))
            grammar.compile(None).initial_state()
        except Error:
            pass

    return check


def _json_schema(converter: str) -> Check:
    def check(data: bytes) -> None:
        try:
            text = json_schema_to_gbnf(text_of(data), converter=converter)
        except Error:
            return
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:   # lone surrogates of the schema's strings: no UTF-8 grammar
            try:
                Grammar.from_string(text)
            except Error:
                pass
            return
        Grammar.from_string(text)   # what a converter writes from Unicode text must parse

    return check


def json_schema_py() -> Check:
    return _json_schema("llama-cpp-python")


def json_schema_cpp() -> Check:
    return _json_schema("llama.cpp")


# a small SPM vocabulary: the 256 byte tokens and multi-byte pieces JSON and the tests' grammars
# use, so that random ids spell text a grammar can follow
MATCH_PIECES = ["true", "false", "null", '"', '":', '", "', "{", "}", "[", "]", "\u2581", "\u2581a",
                "ab", "abc", "12", "0.5", "-1", "\n", "  ", "yes", "no", "\u00e9", "\u4e2d\u6587"]


def match_vocab() -> Vocab:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + MATCH_PIECES
    n = len(tokens)
    return Vocab.from_metadata({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array([0.0] * 259 + [-float(i) for i in range(n - 259)], np.float32),
        "tokenizer.ggml.token_type": np.array([2, 3, 3] + [6] * 256 + [1] * (n - 259), np.int32),
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0})


def grammar_match() -> Check:
    """Input: GBNF text, a NUL, then token ids (two bytes each, little-endian, modulo the
    vocabulary size)."""
    vocab = match_vocab()

    def check(data: bytes) -> None:
        text, _, raw = data.partition(b"\0")
        try:
            compiled = Grammar.from_string(text_of(text)).compile(vocab)
        except Error:
            return
        state = compiled.initial_state()
        ids = np.frombuffer(raw[:len(raw) // 2 * 2], "<u2").astype(np.int64) % vocab.n_tokens
        for token in ids[:64].tolist():
            mask = compiled.mask(state)
            assert mask.shape == (vocab.n_tokens,) and mask.dtype == np.bool_
            allowed = compiled.check(state, token)
            assert bool(mask[token]) == allowed, (token, allowed)
            # the converse does not hold, in llama.cpp either: accepting a masked token whose
            # piece is empty, starts with NUL or breaks a partial UTF-8 sequence leaves the
            # stacks as they were
            try:
                state = compiled.accept(state, token)
            except Error:
                assert not allowed, f"token {token} allowed by the mask, refused by accept"
                return
        compiled.can_end(state)

    return check
