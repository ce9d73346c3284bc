"""The RWKV tokenizer (greedy longest match over unescaped token bytes) against llama.cpp's.

llama.cpp ships no RWKV vocabulary test file: the vocabulary is the tiny model writer's (every
byte escaped as llama.cpp's converter writes it, words with their prefixes, escapes, UTF-8), the
texts are the inputs of llama.cpp's vocabulary test files in /work/shared/vocab and generated
ones; tokens, pieces and detokenized text must equal llama-cpp-python's.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _llama import LlamaVocab
from gguflm import Model
from test_vocab import SEPARATOR
from tiny_models import N_VOCAB, RWKV_PIECES, TinyRwkv, write_tiny_rwkv


def _vocabs(tmp_path_factory, kind: str):
    """gguflm's and llama.cpp's vocabulary of a one-block model with the writer's ``kind`` one."""
    path = tmp_path_factory.mktemp(kind) / f"{kind}_vocab.gguf"
    write_tiny_rwkv(TinyRwkv(vocab=kind, n_layer=1), path, np.random.default_rng(0))
    with Model.load(path, vocab_only=True) as model:
        yield model.vocab, LlamaVocab(path)


@pytest.fixture(scope="module")
def rwkv_vocab(tmp_path_factory):
    yield from _vocabs(tmp_path_factory, "rwkv")


def _suite_texts(vocab_dir) -> list[bytes]:
    texts = []
    for inp in sorted(vocab_dir.glob("*.inp")):
        texts += inp.read_bytes().split(SEPARATOR)
    return texts


def test_suite_texts_equal_llama(rwkv_vocab, vocab_dir) -> None:
    """Every input of llama.cpp's vocabulary suites, with and without special tokens."""
    ours, theirs = rwkv_vocab
    texts = _suite_texts(vocab_dir) + [b"<s>hello<s> the", b"\xff\xfe\xff", b"a\\nb"]
    assert len(texts) > 100
    for add_special, parse_special in ((False, False), (True, True)):
        failed = [t for t in texts if ours.tokenize(t, add_special, parse_special)
                  != theirs.tokenize(t, add_special, parse_special)]
        assert not failed, failed[:3]


_ALPHABET = st.sampled_from([p.decode("utf-8", "replace") for p in RWKV_PIECES] +
                            list("thea nd\n\t\\'xé中文") + ["<s>"])


@settings(max_examples=40, deadline=None)
@given(st.lists(_ALPHABET, max_size=20).map("".join) | st.binary(max_size=24))
def test_generated_texts_equal_llama(rwkv_vocab, text) -> None:
    ours, theirs = rwkv_vocab
    raw = text.encode() if isinstance(text, str) else text
    ids = ours.tokenize(raw, add_special=False, parse_special=True)
    assert ids == theirs.tokenize(raw, False, True)
    # every byte comes back: the pieces are the unescaped token bytes
    assert ours.detokenize_bytes(ids) == theirs.detokenize(ids, False, False) == raw.replace(b"<s>", b"")


def test_pieces_and_special_ids_equal_llama(rwkv_vocab) -> None:
    ours, theirs = rwkv_vocab
    assert ours.n_tokens == theirs.n_tokens == N_VOCAB
    for special in (False, True):
        assert [ours.token_to_piece(t, special=special) for t in range(N_VOCAB)] == \
            [theirs.token_to_piece(t, special=special) for t in range(N_VOCAB)]
    assert ours.nl == theirs.special_ids()["nl"] == ours.tokenize(b"\n", False)[0]
    assert {"bos": ours.bos, "eos": ours.eos} == {k: theirs.special_ids()[k] for k in ("bos", "eos")}
    assert (ours.add_bos, ours.add_eos) == (theirs.flags()["add_bos"], theirs.flags()["add_eos"])


def test_no_vocab_model_takes_ids(tmp_path) -> None:
    """tokenizer.ggml.model 'none': {arch}.vocab_size blank tokens, no special ones; text is
    refused with a clear error (llama.cpp aborts, as it does on a token's piece or attributes),
    ids render as nothing, and the model runs on ids with llama.cpp's logits."""
    from _llama import LlamaDecoder
    from gguflm import Context
    from gguflm.errors import VocabError
    from _memory_pair import decode_entries

    path = tmp_path / "none.gguf"
    write_tiny_rwkv(TinyRwkv(vocab="none"), path, np.random.default_rng(2))
    theirs = LlamaVocab(path)
    tokens = [5, 300, 17, 0, 99]
    ref = LlamaDecoder(path, n_ctx=64)
    try:
        want = ref.decode(tokens, 0)
    finally:
        ref.close()
    with Model.load(path) as model:
        vocab = model.vocab
        assert vocab.n_tokens == model.n_vocab == theirs.n_tokens == N_VOCAB
        assert all(v is None for v in theirs.special_ids().values())
        assert (vocab.bos, vocab.eos, vocab.nl, vocab.eog_ids) == (None, None, None, frozenset())
        with pytest.raises(VocabError, match="no vocabulary"):
            vocab.tokenize("hello")
        assert vocab.detokenize_bytes(tokens) == theirs.detokenize(tokens, False, False) == b""
        assert vocab.token_to_piece(5, special=True) == b""
        with Context(model, n_ctx=64, n_threads=2) as ctx:
            np.testing.assert_array_equal(decode_entries(ctx, [(t, k, 0, True) for k, t in enumerate(tokens)]), want)


@pytest.fixture(scope="module")
def plamo2_vocab(tmp_path_factory):
    yield from _vocabs(tmp_path_factory, "plamo2")


def test_plamo2_suite_texts_equal_llama(plamo2_vocab, vocab_dir) -> None:
    """PLaMo-2: every input of llama.cpp's vocabulary suites, with and without special tokens,
    a byte-order mark and invalid UTF-8; every piece; the special ids and flags."""
    ours, theirs = plamo2_vocab
    texts = _suite_texts(vocab_dir) + ["\ufeffhello world", "<|plamo:bos|>日本語です<|plamo:eos|>",
                                       "\ufeff\ufeff", "helloworld hello"]
    texts = [t if isinstance(t, bytes) else t.encode() for t in texts] + [b"\xff\xfeab\xc3", b"\xe6\x97"]
    for add_special, parse_special in ((False, False), (True, True)):
        failed = [t for t in texts if ours.tokenize(t, add_special, parse_special)
                  != theirs.tokenize(t, add_special, parse_special)]
        assert not failed, failed[:3]
    for special in (False, True):
        assert [ours.token_to_piece(t, special=special) for t in range(N_VOCAB)] == \
            [theirs.token_to_piece(t, special=special) for t in range(N_VOCAB)]
    assert {k: getattr(ours, k) for k in ("bos", "eos", "nl", "pad")} == \
        {k: theirs.special_ids()[k] for k in ("bos", "eos", "nl", "pad")}
    assert (ours.add_bos, ours.add_eos) == (theirs.flags()["add_bos"], theirs.flags()["add_eos"])


_PLAMO2_ALPHABET = st.sampled_from(["hello", "hel", "lo", " world", "日本語", "です", "😀", "é", "t", "ü", " ", "\n",
                                    "\u2581", "abc", "xyz", "12", "3", "<|plamo:eos|>", "\ufeff"])


@settings(max_examples=40, deadline=None)
@given(st.lists(_PLAMO2_ALPHABET, max_size=16).map("".join))
def test_plamo2_generated_texts_equal_llama(plamo2_vocab, text) -> None:
    ours, theirs = plamo2_vocab
    raw = text.encode()
    ids = ours.tokenize(raw, add_special=False, parse_special=True)
    assert ids == theirs.tokenize(raw, False, True)
    assert ours.detokenize_bytes(ids, unparse_special=True) == theirs.detokenize(ids, False, True)


@pytest.fixture(scope="module")
def hybriddna_vocab(tmp_path_factory):
    yield from _vocabs(tmp_path_factory, "hybriddna")


_DNA_ALPHABET = st.sampled_from(["<dna>", "</dna>", "ACGTAC", "acgtac", "CCCCCC", "AAAAAA", "A", "c", "G", "t", "N",
                                 "hello", " world", " ", "\n", "é", "<oov>", "<dna", "dna>"])


@settings(max_examples=40, deadline=None)
@given(st.lists(_DNA_ALPHABET, max_size=16).map("".join), st.booleans())
def test_hybriddna_texts_equal_llama(hybriddna_vocab, text, parse_special) -> None:
    """HybriDNA: BPE outside the tags, 6-mers inside (tags read from raw text only, i.e. when
    specials are not parsed), the k-mers' marker off their pieces."""
    ours, theirs = hybriddna_vocab
    raw = text.encode()
    ids = ours.tokenize(raw, add_special=False, parse_special=parse_special)
    assert ids == theirs.tokenize(raw, False, parse_special)
    assert ours.detokenize_bytes(ids, unparse_special=True) == theirs.detokenize(ids, False, True)


def test_hybriddna_suite_and_pieces_equal_llama(hybriddna_vocab, vocab_dir) -> None:
    ours, theirs = hybriddna_vocab
    texts = _suite_texts(vocab_dir)
    failed = [t for t in texts if ours.tokenize(t, False, False) != theirs.tokenize(t, False, False)]
    assert not failed, failed[:3]
    for special in (False, True):
        assert [ours.token_to_piece(t, special=special) for t in range(N_VOCAB)] == \
            [theirs.token_to_piece(t, special=special) for t in range(N_VOCAB)]
    assert ours.nl == theirs.special_ids()["nl"]


@pytest.fixture(scope="module")
def whitespace_vocab(tmp_path_factory):
    yield from _vocabs(tmp_path_factory, "whitespace")


_WS_ALPHABET = st.sampled_from(["hello", "hell", "Hello", "世界", "世", "abc", "12", "über", "é", " ", "  ", "\t", "\n",
                                "\u3000", "\u00a0", "x", "<s>", "!", ".", "q"])


@settings(max_examples=40, deadline=None)
@given(st.lists(_WS_ALPHABET, max_size=16).map("".join) | st.binary(max_size=12))
def test_whitespace_texts_equal_llama(whitespace_vocab, text) -> None:
    """The whitespace tokenizer: BPE between white-space code points (ASCII, ideographic, no-break),
    unknown characters as byte tokens."""
    ours, theirs = whitespace_vocab
    raw = text.encode() if isinstance(text, str) else text
    for parse_special in (False, True):
        ids = ours.tokenize(raw, add_special=True, parse_special=parse_special)
        assert ids == theirs.tokenize(raw, True, parse_special)
        assert ours.detokenize_bytes(ids) == theirs.detokenize(ids, False, False)


def test_whitespace_suite_and_pieces_equal_llama(whitespace_vocab, vocab_dir) -> None:
    ours, theirs = whitespace_vocab
    failed = [t for t in _suite_texts(vocab_dir) if ours.tokenize(t, False, False) != theirs.tokenize(t, False, False)]
    assert not failed, failed[:3]
    for special in (False, True):
        assert [ours.token_to_piece(t, special=special) for t in range(N_VOCAB)] == \
            [theirs.token_to_piece(t, special=special) for t in range(N_VOCAB)]
    assert (ours.nl, ours.bos, ours.add_bos) == (theirs.special_ids()["nl"], theirs.special_ids()["bos"],
                                                 theirs.flags()["add_bos"])
