"""Every tokenizer on random bytes, ``parse_special`` on and off, and detokenize of random ids.

Vocabularies: llama.cpp's test vocabularies in ``tests/data/vocab`` (SPM: llama-spm; BPE: GPT-2's,
under one name of each distinct pre-tokenizer llama.cpp maps; WPM: bert-bge), a hand-made unigram
(UGM) one and the tiny RWKV one of ``tests/tiny_models.py``.

Must hold: ids inside the vocabulary, detokenize working on them, and the round trips llama.cpp's
own tokenizer tests rely on — SPM gives valid UTF-8 text back (its escaped space U+2581 as a
space; parse_special off), byte-level BPE pieces spell the input bytes exactly (valid UTF-8,
parse_special off, every byte has a token), RWKV pieces spell any input exactly. A
:class:`gguflm.Error` is allowed; detokenize raises ValueError exactly when an id is outside the
vocabulary (its documented contract).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gguflm import Model
from gguflm._ext import tokenize as _tk
from gguflm.errors import Error
from gguflm.gguf import GGUFReader
from gguflm.tokenizers import bpe
from gguflm.vocab import Vocab

from . import Check

VOCAB_DIR = Path(os.environ.get("GGUFLM_SHARED") or Path(__file__).resolve().parents[1] / "data") / "vocab"

# one pre-tokenizer name per distinct pre-tokenizer
BPE_PRE = list({id(spec): name for name, spec in reversed(bpe.PRE_TOKENIZERS.items())}.values())


@functools.cache
def file_vocab(name: str) -> Vocab:
    with Model.load(VOCAB_DIR / f"ggml-vocab-{name}.gguf", vocab_only=True) as model:
        return model.vocab


@functools.cache
def _gpt2_metadata() -> dict:
    with GGUFReader(VOCAB_DIR / "ggml-vocab-gpt-2.gguf", mode="read") as reader:
        return dict(reader.metadata)


@functools.cache
def bpe_vocab(pre: str) -> Vocab:
    # a separator for the pre-tokenizers that add one (jina-v1-en, roberta-bpe)
    return Vocab.from_metadata({**_gpt2_metadata(), "tokenizer.ggml.pre": pre,
                                "tokenizer.ggml.seperator_token_id": 50256})


UGM_PIECES = ["\u2581", "\u2581a", "a", "b", "ab", "abc", "x", "\u00e9", "e\u0301", "\uff21\uff22", "\u00df",
              "\u3000", "\u65e5\u672c", "\ufb01", "<u>", "\u2581the", "the", "1", "12", "."]


@functools.cache
def ugm_vocab() -> Vocab:
    tokens = ["<pad>", "</s>", "<unk>", *UGM_PIECES]
    n = len(tokens)
    return Vocab.from_metadata({
        "tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": -np.linspace(0.5, 12.0, n, dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([3, 3, 2] + [1] * (n - 4) + [4], np.int32),
        "tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.remove_extra_whitespaces": True})


@functools.cache
def rwkv_vocab() -> Vocab:
    from tests.tiny_models import N_VOCAB, RWKV_PIECES   # the tiny models' vocabulary, as written there

    tokens = ["<s>"] + [repr(bytes([b]))[2:-1] for b in range(256)] + [repr(p)[2:-1] for p in RWKV_PIECES]
    tokens += [f"[PAD{i}]" for i in range(N_VOCAB - len(tokens))]
    return Vocab.from_metadata({"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": tokens,
                                "tokenizer.ggml.token_type": np.array([3] + [1] * (N_VOCAB - 1), np.int32)})


def _byte_level(vocab: Vocab) -> bool:
    """Byte-level BPE with a token for every byte: its pieces spell any valid UTF-8 input."""
    spec = bpe.pre_tokenizer(vocab.pre)
    return not (spec.spm_style or spec.raw_bytes) and all(
        vocab.token_id(_tk.gpt2_byte_to_text(b)) is not None for b in range(256))


def _valid_utf8(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _tokenize(vocab: Vocab, flags: int, raw: bytes) -> list[int] | None:
    """Input: a flags byte (bit 0 parse_special, bit 1 add_special), then the text's bytes."""
    try:
        ids = vocab.tokenize(raw, add_special=bool(flags & 2), parse_special=bool(flags & 1))
    except Error:
        return None
    assert all(0 <= t < vocab.n_tokens for t in ids), ids
    vocab.detokenize(ids, remove_special=bool(flags & 2), unparse_special=bool(flags & 1))
    return ids


def _pieces(vocab: Vocab, ids: list[int]) -> bytes:
    return b"".join(vocab.token_to_piece(t, special=True) for t in ids)


def _target(pick: Callable[[int], Vocab], round_trip: Callable[[Vocab, bytes, list[int]], None] | None) -> Check:
    def check(data: bytes) -> None:
        if len(data) < 2:
            return
        vocab, flags, raw = pick(data[0]), data[1], data[2:]
        ids = _tokenize(vocab, flags, raw)
        if ids is not None and round_trip is not None and not flags & 1:
            round_trip(vocab, raw, ids if not flags & 2 else vocab.tokenize(raw, False, False))

    return check


def _spm_round_trip(vocab: Vocab, raw: bytes, ids: list[int]) -> None:
    text = _valid_utf8(raw)
    if text is not None:
        assert vocab.detokenize(ids, unparse_special=True) == text.replace("\u2581", " ")


def _bpe_round_trip(vocab: Vocab, raw: bytes, ids: list[int]) -> None:
    if _valid_utf8(raw) is not None and _byte_level(vocab):
        assert _pieces(vocab, ids) == raw


def _rwkv_round_trip(vocab: Vocab, raw: bytes, ids: list[int]) -> None:
    assert _pieces(vocab, ids) == raw


def _one(vocab: Vocab) -> Callable[[int], Vocab]:
    return lambda b: vocab


def tokenize_spm() -> Check:
    return _target(_one(file_vocab("llama-spm")), _spm_round_trip)


def tokenize_bpe() -> Check:
    """The first byte picks the pre-tokenizer."""
    vocabs = [bpe_vocab(pre) for pre in BPE_PRE]   # built up front: a quarter second each
    return _target(lambda b: vocabs[b % len(vocabs)], _bpe_round_trip)


def tokenize_wpm() -> Check:
    return _target(_one(file_vocab("bert-bge")), None)


def tokenize_ugm() -> Check:
    return _target(_one(ugm_vocab()), None)


def tokenize_rwkv() -> Check:
    return _target(_one(rwkv_vocab()), _rwkv_round_trip)


# the vocabularies detokenize picks from (the first input byte); each target builds what it uses
# before fuzzing: building one inside a run would count against its time
DETOKENIZE_VOCABS: list[Callable[[], Vocab]] = [
    lambda: file_vocab("llama-spm"), lambda: bpe_vocab("gpt-2"), lambda: file_vocab("bert-bge"),
    ugm_vocab, rwkv_vocab]


def detokenize() -> Check:
    """Input: the vocabulary (first byte), flags (bit 0 remove_special, bit 1 unparse_special),
    then ids as little-endian int32 taken modulo a range a little wider than the vocabulary."""
    vocabs = [make() for make in DETOKENIZE_VOCABS]

    def check(data: bytes) -> None:
        if len(data) < 2:
            return
        vocab = vocabs[data[0] % len(vocabs)]
        flags, raw = data[1], data[2:]
        ids = (np.frombuffer(raw[:len(raw) // 4 * 4], "<i4").astype(np.int64) % (vocab.n_tokens + 16) - 8).tolist()
        inside = all(0 <= t < vocab.n_tokens for t in ids)
        try:
            text = vocab.detokenize(ids, remove_special=bool(flags & 1), unparse_special=bool(flags & 2))
        except ValueError:
            assert not inside, "ValueError for ids inside the vocabulary"
            return
        assert inside, "ids outside the vocabulary detokenized"
        assert isinstance(text, str)
        for t in ids[:16]:
            vocab.token_to_piece(t, lstrip=flags >> 4, special=bool(flags & 2))

    return check
