"""Property tests for tokenize / token_to_piece / detokenize.

Round trips hold without any oracle; exactness on arbitrary text is checked against llama.cpp
itself (llama-cpp-python's C bindings) when it is installed, on every vocabulary of llama.cpp's
suite, both real models, and hand-made vocabularies for pre-tokenizers and special-token rules the
suite does not cover.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path

import numpy as np
import pytest
from _llama import LlamaVocab, require_llama
from _metadata import read_metadata, write_metadata
from conftest import VOCAB_DIR
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_vocab import VOCAB_FILES, vocab_of

from gguflm._ext import tokenize as _tk
from gguflm.bench import tokenizer as bench
from gguflm.tokenizers import bpe
from gguflm.errors import VocabError
from gguflm.vocab import Vocab

# pieces that exercise the splitters, the special-token partition and the space rules
PIECES = [" ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", " \n ", "'s", "'LL", " 're", " ' ", " .",
          " ?", "3", "123", "45678", "Hello", " world", "ÄÖü", "é", "e\u0301", "我想", "🦙",
          "\u3000",
          "\u00a0", "\u2581", "...", "!?", "<s>", "</s>", "<unk>", "<|im_end|>", "<|endoftext|>",
          "<start_of_turn>", "<end_of_turn>", "<0x0A>", "<table>", "[MASK]", "<|eot_id|>",
          "\u0660\u0661", "½", "\x00", "\x0b", "\u2028", "Ⅻ", "ｶ", "\U0001f600\u200d"]
TEXTS = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(PIECES)), max_size=10).map("".join)
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

REAL = ["gemma", "smollm"]
ALL_VOCABS = VOCAB_FILES + REAL


def vocab_path(request, name: str) -> Path:
    return VOCAB_DIR / name if name.endswith(".gguf") else request.getfixturevalue(f"{name}_path")


@functools.cache
def llama_of(path: Path) -> LlamaVocab:
    return LlamaVocab(path)


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_tokenize_matches_llama_cpp(request, name):
    path = vocab_path(request, name)
    vocab, llama = vocab_of(path), llama_of(path)

    @SETTINGS
    @given(text=TEXTS, add_special=st.booleans(), parse_special=st.booleans())
    def check(text, add_special, parse_special):
        data = text.encode()
        assert vocab.tokenize(text, add_special, parse_special) == \
            llama.tokenize(data, add_special, parse_special)

    check()


def past_unicode(data: bytes) -> bool:
    """llama.cpp throws (and aborts) on bytes that decode past U+10FFFF; keep those out."""
    try:
        _tk.CodepointText(data)
        return False
    except ValueError:
        return True


@pytest.mark.parametrize("name", ["ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-bpe.gguf",
                                  "ggml-vocab-llama-spm.gguf", "ggml-vocab-gemma-4.gguf",
                                  "ggml-vocab-bert-bge.gguf", "ggml-vocab-qwen35.gguf"])
def test_invalid_utf8_matches_llama_cpp(name):
    path = VOCAB_DIR / name
    vocab, llama = vocab_of(path), llama_of(path)

    @SETTINGS
    @given(data=st.binary(max_size=24).filter(lambda b: not past_unicode(b)))
    def check(data):
        assert vocab.tokenize(data, False, False) == llama.tokenize(data, False, False)

    check()


BYTE_LEVEL = [n for n in VOCAB_FILES if n.endswith(("gpt-2.gguf", "llama-bpe.gguf", "qwen35.gguf",
                                                     "deepseek-llm.gguf", "falcon.gguf", "mpt.gguf",
                                                     "refact.gguf", "starcoder.gguf"))] + ["smollm"]


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_byte_level_bpe_round_trip(request, name):
    """The pieces of tokenize(s) spell s exactly; detokenize gives s back unless the vocabulary
    cleans spaces around punctuation (clean_up_tokenization_spaces). Some vocabularies lack a
    token for a few bytes (Falcon: control bytes; StarCoder: bytes never in UTF-8 and 0xF1);
    such bytes vanish, in llama.cpp too, so the text here avoids them."""
    vocab = vocab_of(vocab_path(request, name))
    covered = {b for b in range(256) if vocab.token_id(_tk.gpt2_byte_to_text(b)) is not None}
    assert len(covered) >= 228
    chars = st.characters(exclude_categories=["Cs"]).filter(
        lambda c: all(b in covered for b in c.encode()))
    pieces = [p for p in PIECES if all(b in covered for b in p.encode())]

    @settings(max_examples=60, deadline=None)
    @given(text=st.lists(st.text(chars, max_size=8) | st.sampled_from(pieces),
                         max_size=10).map("".join))
    def check(text):
        ids = vocab.tokenize(text, add_special=False)
        assert b"".join(vocab.token_to_piece(t, special=True) for t in ids) == text.encode()
        if not vocab.clean_spaces:
            assert vocab.detokenize(ids, unparse_special=True) == text

    check()


@pytest.mark.parametrize("name", ["gemma", "ggml-vocab-llama-spm.gguf"])
def test_spm_round_trip(request, name):
    """SPM gives text back, the space it prefixes removed again by detokenize (add_space_prefix),
    up to two documented rules: U+2581 in the text is SPM's escaped space, so it comes back as a
    space; and after a special-token fragment SPM prefixes another space, which stays (llama-spm
    has no user-defined tokens and Gemma prefixes no space, so that rule does not show here)."""
    vocab = vocab_of(vocab_path(request, name))

    @settings(max_examples=60, deadline=None)
    @given(text=st.text(max_size=40) | TEXTS)
    def check(text):
        want = text.replace("\u2581", " ")
        ids = vocab.tokenize(text, add_special=False)
        assert vocab.detokenize(ids, unparse_special=True) == want
        ids = vocab.tokenize(text, add_special=True)
        assert vocab.detokenize(ids[1:], unparse_special=True) == want

    check()


@pytest.mark.parametrize("name", REAL)
def test_pieces_concatenate_to_detokenize(request, name):
    """For vocabularies without a space prefix or space cleanup, detokenize is exactly the
    concatenation of token_to_piece."""
    vocab = vocab_of(vocab_path(request, name))
    assert not vocab.add_space_prefix and not vocab.clean_spaces
    for tok in range(vocab.n_tokens):
        assert vocab.detokenize_bytes([tok], unparse_special=True) == \
            vocab.token_to_piece(tok, special=True)

    @settings(max_examples=60, deadline=None)
    @given(ids=st.lists(st.integers(0, vocab.n_tokens - 1), max_size=30), special=st.booleans())
    def check(ids, special):
        joined = b"".join(vocab.token_to_piece(t, special=special) for t in ids)
        assert vocab.detokenize_bytes(ids, unparse_special=special) == joined

    check()


APOSTROPHES = st.lists(st.sampled_from([" ' ", " '", "'", " 's", " 'm", " 're", " 've", " 'll",
                                        " 't", " .", " ,", " ?", " !", "  ", "a", " b", "."]),
                       max_size=12).map("".join)


@pytest.mark.parametrize("name", ["ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf",
                                  "ggml-vocab-bert-bge.gguf", "smollm", "gemma"])
def test_detokenize_matches_llama_cpp(request, name):
    """Space cleanup, BOS/EOS removal and special rendering, against llama_detokenize."""
    path = vocab_path(request, name)
    vocab, llama = vocab_of(path), llama_of(path)

    @SETTINGS
    @given(text=APOSTROPHES | TEXTS, extra=st.lists(st.integers(0, vocab.n_tokens - 1), max_size=4),
           remove=st.booleans(), unparse=st.booleans())
    def check(text, extra, remove, unparse):
        ids = vocab.tokenize(text, add_special=True) + extra
        want = llama.detokenize(ids, remove, unparse)
        assert vocab.detokenize_bytes(ids, remove, unparse) == want

    check()


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=30) | TEXTS)
def test_native_digit_split_is_the_regex(text):
    """The native \\p{N} splitter cuts where llama.cpp's collapsed std::regex does."""
    data = text.encode()
    assert _tk.split_lengths(data, [bpe.DIGITS]) == \
        _tk.split_lengths(data, [bpe.RegexSplit("\\p{N}")])


# ---- hand-made vocabularies: pre-tokenizers and special-token rules beyond the suite ----------

@functools.cache
def gpt2_meta() -> dict:
    return read_metadata(VOCAB_DIR / "ggml-vocab-gpt-2.gguf")


OTHER_PRE = ["default", "qwen2", "stablelm2", "gpt-4o", "tekken", "deepseek-v3", "deepseek-coder",
             "chameleon", "poro-chat", "viking", "bailingmoe", "seed-coder", "command-r", "dbrx",
             "chatglm-bpe", "jina-v1-en", "sarvam-moe"]


@pytest.mark.parametrize("pre", OTHER_PRE)
def test_other_pre_tokenizers_match_llama_cpp(tmp_path, pre):
    """GPT-2's vocabulary under other pre-tokenizer names: splitting, flags and special ids."""
    require_llama()
    meta = {**gpt2_meta(), "tokenizer.ggml.pre": pre, "tokenizer.ggml.seperator_token_id": 50256}
    path = tmp_path / f"{pre}.gguf"
    write_metadata(path, meta)
    vocab, llama = Vocab.from_metadata(meta), LlamaVocab(path)
    assert {k: getattr(vocab, k) for k in llama.special_ids()} == llama.special_ids()

    # every printable ASCII character in the contexts the regexes' classes decide: a category
    # table missing one (llama.cpp counts "~" as \p{S}) fails here, not only when hypothesis
    # happens to draw it
    for c in map(chr, range(0x20, 0x7F)):
        for text in (" " + c, c + c, c + "a", " " + c + "\n", c + "1"):
            assert vocab.tokenize(text, False) == llama.tokenize(text.encode(), False, False), text

    @settings(max_examples=25, deadline=None)
    @given(text=TEXTS, add_special=st.booleans())
    def check(text, add_special):
        want = llama.tokenize(text.encode(), add_special, False)
        assert vocab.tokenize(text, add_special) == want
        ids = vocab.tokenize(text, False)
        assert vocab.detokenize_bytes(ids) == llama.detokenize(ids, False, False)

    check()


SPECIAL_TEXTS = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                 "<EOT>", "<|eom_id|>", "<|fim_prefix|>", "<PRE>", "<fim-prefix>", "<|file_sep|>",
                 "<|fim_pad|>", "[PAD]", "<reponame>", "<|repo_name|>", "<|return|>", "<|call|>",
                 "</s>", "<|tool_response>", "<|channel|>", "<mask>", "ab", "b", "a\n", "\n\n",
                 "<0x0A>", "  "]


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hand_made_vocab_specials_match_llama_cpp(tmp_path_factory, data):
    """Random SPM vocabularies sprinkled with special-looking tokens of random types and names:
    special ids (llama.cpp's map-order text fallbacks), EOG, attributes and tokenization."""
    require_llama()
    fillers = data.draw(st.lists(st.text(alphabet="abcdefgh<>|_ \n", min_size=1, max_size=5),
                                 min_size=5, max_size=300, unique=True))
    specials = data.draw(st.lists(st.sampled_from(SPECIAL_TEXTS), unique=True, max_size=12))
    # every byte has a token, so that no text runs into llama.cpp's abort on a missing one
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = list(dict.fromkeys(["<unk>", "<s>"] + byte_tokens + specials + fillers))
    order = data.draw(st.permutations(range(258, len(tokens))))
    tokens = tokens[:258] + [tokens[i] for i in order]
    n = len(tokens)
    types = np.array(data.draw(st.lists(st.sampled_from([1, 1, 1, 3, 4, 5, 6, 0]), min_size=n,
                                        max_size=n)), np.int32)
    types[:258] = [2, 3] + [6] * 256
    meta = {"general.architecture": "llama",
            "general.name": data.draw(st.sampled_from(["test", "jina", "modern-bert"])),
            "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.array(data.draw(st.lists(
                st.floats(-10, 0, width=32), min_size=n, max_size=n)), np.float32),
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.add_space_prefix": data.draw(st.booleans())}
    path = tmp_path_factory.mktemp("vocab") / "v.gguf"
    write_metadata(path, meta)
    try:
        llama = LlamaVocab(path)
    except RuntimeError:  # e.g. a byte token too short for <0xXX>: refused by both
        with pytest.raises(VocabError):
            Vocab.from_metadata(meta)
        return
    vocab = Vocab.from_metadata(meta)
    assert {k: getattr(vocab, k) for k in llama.special_ids()} == llama.special_ids()
    assert vocab.eog_ids == llama.eog_ids()
    assert [int(vocab.token_attr(t)) for t in range(n)] == [llama.attr(t) for t in range(n)]
    for _ in range(5):
        text = "".join(data.draw(st.lists(st.sampled_from(tokens[258:] + ["x", " ", "é"]),
                                          max_size=8)))
        for parse in (False, True):
            assert vocab.tokenize(text, True, parse) == llama.tokenize(text.encode(), True, parse)


def test_bench_measures_a_tiny_text(smollm_path):
    row = bench.measure(smollm_path, "Hello, world! " * 20, 2, False,
                        lambda p: Vocab.from_metadata(read_metadata(p)))
    assert row["tokens"] > 20 and row["model"] == smollm_path.name
    assert row["ours_mbs"] > 0 and row["ours_cold_mbs"] > 0
    assert len(bench.corpus()) > 100_000


# ---- unigram (t5): no such vocabulary in llama.cpp's suite, so hand-made ones --------------

def build_charsmap(mapping: dict[bytes, bytes]) -> np.ndarray:
    """A SentencePiece precompiled charsmap for a few replacements: the XOR-compressed double
    array (each node's children in a fresh 256-slot block, so that block start ^ byte finds them;
    a leaf's replacement offset at its block's slot 0), then the NUL-terminated replacements."""
    repl, offsets = bytearray(), {}
    for key, value in mapping.items():
        offsets[key] = len(repl)
        repl += value + b"\0"
    cells = {0: 256 << 10}          # the root's children live in block 1
    block = {b"": 1}
    for key in mapping:
        for d in range(1, len(key) + 1):
            prefix = key[:d]
            if prefix not in block:
                index = 256 * block[prefix[:-1]] + prefix[-1]
                block[prefix] = len(block) + 1
                cells[index] = ((index ^ (256 * block[prefix])) << 10) | prefix[-1]
        cells[256 * block[key[:-1]] + key[-1]] |= 1 << 8
        cells[256 * block[key]] = (1 << 31) | offsets[key]
    xcda = np.zeros(256 * (len(block) + 1), np.uint32)
    for index, packed in cells.items():
        xcda[index] = packed
    blob = struct.pack("<I", xcda.nbytes) + xcda.astype("<u4").tobytes() + bytes(repl)
    return np.frombuffer(blob, np.uint8).copy()


UGM_PIECES = ["a", "b", "ab", "abc", "\u2581", "\u2581a", "x", "é", "e\u0301", "ＡＢ", "  ",
              "<u>",
              "ß", "\u3000", "Ⅸ", "日本", "ﬁ"]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_unigram_matches_llama_cpp(tmp_path_factory, data):
    """Hand-made unigram vocabularies, with and without a charsmap, against llama.cpp."""
    require_llama()
    pieces = data.draw(st.lists(st.sampled_from(UGM_PIECES) | st.text(min_size=1, max_size=3),
                                min_size=1, max_size=40, unique=True))
    tokens = list(dict.fromkeys(["<pad>", "</s>", "<unk>"] + pieces))
    n = len(tokens)
    types = [3, 3, 2] + data.draw(st.lists(st.sampled_from([1, 1, 1, 1, 4, 5, 3]), min_size=n - 3,
                                           max_size=n - 3))
    meta = {"general.architecture": "t5", "general.name": "t", "tokenizer.ggml.model": "t5",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.array(data.draw(st.lists(
                st.floats(-20, 0, width=32), min_size=n, max_size=n)), np.float32),
            "tokenizer.ggml.token_type": np.array(types, np.int32),
            "tokenizer.ggml.add_space_prefix": data.draw(st.booleans()),
            "tokenizer.ggml.remove_extra_whitespaces": data.draw(st.booleans())}
    keys = data.draw(st.lists(st.sampled_from(["Ａ", "Ｂ", "\u3000", "ﬁ", "Ⅸ", "e\u0301", "ab",
                                               "x"]), unique=True, max_size=5))
    if keys:
        meta["tokenizer.ggml.precompiled_charsmap"] = build_charsmap(
            {k.encode(): data.draw(st.sampled_from(["A", "B", " ", "fi", "IX", "é", "",
                                                    "a b"])).encode() for k in keys})
    path = tmp_path_factory.mktemp("ugm") / "u.gguf"
    write_metadata(path, meta)
    vocab, llama = Vocab.from_metadata(meta), LlamaVocab(path)
    assert {k: getattr(vocab, k) for k in llama.special_ids()} == llama.special_ids()
    for _ in range(8):
        text = "".join(data.draw(st.lists(st.sampled_from(tokens[3:] + keys + [" ", "q", "\n"]),
                                          max_size=10)))
        for parse in (False, True):
            assert vocab.tokenize(text, True, parse) == llama.tokenize(text.encode(), True, parse)
    ids = vocab.tokenize("ab  x", True)
    assert vocab.detokenize_bytes(ids) == llama.detokenize(ids, False, False)
