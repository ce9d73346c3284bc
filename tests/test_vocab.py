"""Vocabulary loading and tokenization against llama.cpp's own data.

Oracles: llama.cpp's tokenizer suite (tests/data/vocab, written by llama.cpp's test-tokenizer-0),
llama.cpp's reference tokens for the two real models, and, when llama-cpp-python is installed,
llama.cpp itself (special ids, end-of-generation sets, token attributes, pieces).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from _llama import LlamaVocab
from _metadata import read_metadata, write_metadata
from conftest import VOCAB_DIR, load_reference

import gguflm
from gguflm.errors import ModelLoadError, VocabError
from gguflm.vocab import TokenAttr, TokenType, Vocab

VOCAB_FILES = sorted(p.name for p in VOCAB_DIR.glob("*.gguf"))
SEPARATOR = b"\n__ggml_vocab_test__\n"


@functools.cache
def metadata_of(path: Path) -> dict:
    return read_metadata(path)


@functools.cache
def vocab_of(path: Path) -> Vocab:
    """The vocabulary as a vocab-only Model.load gives it, whatever the file's architecture (bert,
    falcon, gpt2, mpt, ... that gguflm cannot run); it outlives the closed model."""
    with gguflm.Model.load(path, vocab_only=True) as model:
        return model.vocab


def read_suite(path: Path) -> dict[bytes, list[int]]:
    """Cases of a .inp/.out pair, read as test-tokenizer-0.cpp reads them."""
    raw = path.with_name(path.name + ".inp").read_bytes()
    inputs, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(SEPARATOR, pos)
        if nxt < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:nxt])
        pos = nxt + len(SEPARATOR)
    outputs = path.with_name(path.name + ".out").read_bytes().splitlines()
    assert len(inputs) == len(outputs), "input and output files differ in case count"
    return {s: [int(t) for t in o.strip().split()] for s, o in zip(inputs, outputs)}


def test_vocab_files_present(vocab_dir):
    assert len(VOCAB_FILES) >= 12


@pytest.mark.parametrize("name", VOCAB_FILES)
def test_llama_cpp_tokenizer_suite(vocab_dir, name):
    """Every case of llama.cpp's suite: add_special=False, parse_special=False, on the vocabulary
    of a vocab-only Model.load (bert, falcon, gpt2, mpt, ... included)."""
    vocab = vocab_of(vocab_dir / name)
    cases = read_suite(vocab_dir / name)
    assert cases
    failed = {text: (vocab.tokenize(text, add_special=False, parse_special=False), want)
              for text, want in cases.items()
              if vocab.tokenize(text, add_special=False, parse_special=False) != want}
    assert not failed


@pytest.mark.parametrize("name", VOCAB_FILES)
def test_vocab_file_type_and_pre(vocab_dir, name):
    meta = metadata_of(vocab_dir / name)
    vocab = vocab_of(vocab_dir / name)
    assert vocab.n_tokens == len(meta["tokenizer.ggml.tokens"])
    model = meta["tokenizer.ggml.model"]
    assert vocab.type == {"llama": "spm", "bert": "wpm", "gpt2": "bpe", "gemma4": "bpe"}[model]
    if model == "gpt2":
        assert vocab.pre == meta["tokenizer.ggml.pre"]


@pytest.mark.parametrize("name", VOCAB_FILES + ["gemma", "smollm"])
def test_special_ids_eog_and_attributes_match_llama_cpp(request, vocab_dir, name):
    """Special ids (text fallbacks included), flags, the EOG set and every token's attributes and
    pieces, as llama.cpp reports them."""
    path = vocab_dir / name if name.endswith(".gguf") else request.getfixturevalue(f"{name}_path")
    llama = LlamaVocab(path)
    vocab = vocab_of(path)
    for key, tok in llama.special_ids().items():
        assert getattr(vocab, key) == tok, key
    assert {"add_bos": vocab.add_bos, "add_eos": vocab.add_eos} == llama.flags()
    assert vocab.eog_ids == llama.eog_ids()
    rng = np.random.default_rng(0)
    # every token llama.cpp does not call plainly normal, and a sample of the others
    unusual = [t for t in range(vocab.n_tokens) if llama.attr(t) != TokenAttr.NORMAL]
    for tok in unusual + rng.choice(vocab.n_tokens, 5000).tolist():
        assert int(vocab.token_attr(tok)) == llama.attr(tok), tok
    assert sum(vocab.token_attr(t) != TokenAttr.NORMAL for t in range(vocab.n_tokens)) == \
        len(unusual)
    # every token's piece; without special=True only the unusual tokens can differ
    for tok in range(vocab.n_tokens):
        assert vocab.token_to_piece(tok, 0, True) == llama.token_to_piece(tok, 0, True), tok
    for tok in unusual:
        assert vocab.token_to_piece(tok) == llama.token_to_piece(tok), tok


def test_eot_found_by_text_in_llama_cpp_map_order(smollm_path, vocab_dir):
    """Several EOT-looking tokens: llama.cpp keeps the first its std::unordered_map walk meets
    (values recorded from llama-cpp-python 0.3.36)."""
    assert vocab_of(smollm_path).eot == 0  # <|endoftext|>, not <|im_end|> (2)
    assert vocab_of(vocab_dir / "ggml-vocab-qwen35.gguf").eot == 151645  # <|im_end|>
    assert vocab_of(vocab_dir / "ggml-vocab-phi-3.gguf").eot == 32007  # <|end|>
    assert vocab_of(vocab_dir / "ggml-vocab-llama-bpe.gguf").eot == 128009  # <|eot_id|>


def test_real_model_special_ids(gemma_path, smollm_path):
    gemma, smollm = vocab_of(gemma_path), vocab_of(smollm_path)
    # llama.cpp (llama-cpp-python 0.3.36): bos, eos, eot, nl, eog
    assert (gemma.bos, gemma.eos, gemma.eot, gemma.nl) == (2, 1, 106, 248)
    assert gemma.eog_ids == {1, 106, 212}
    assert gemma.is_eog(106) and not gemma.is_eog(2) and not gemma.is_eog(None)
    assert (smollm.bos, smollm.eos, smollm.eot, smollm.nl, smollm.fim_rep) == (1, 2, 0, 198, 4)
    assert smollm.eog_ids == {0, 2, 4}
    assert (gemma.type, gemma.pre, smollm.type, smollm.pre) == ("spm", "default", "bpe", "smollm")
    assert gemma.add_bos and not smollm.add_bos


@pytest.mark.parametrize("model", ["gemma", "smollm"])
def test_real_model_reference_tokens(request, model):
    """Each prompt of prompts.json gives llama.cpp's tokens (add_special, parse_special)."""
    path = request.getfixturevalue(f"{model}_path")
    vocab = vocab_of(path)
    for case in load_reference(path.name)["cases"]:
        ids = vocab.tokenize(case["prompt"], add_special=True, parse_special=True)
        assert ids == case["tokens"]
        assert vocab.detokenize(case["greedy_tokens"]) == case["greedy_text"]


def test_tokenize_special_handling(gemma_path, smollm_path):
    gemma, smollm = vocab_of(gemma_path), vocab_of(smollm_path)
    turn = "<start_of_turn>user\nHi<end_of_turn>"
    with_special = gemma.tokenize(turn, add_special=False, parse_special=True)
    assert with_special[0] == gemma.token_id("<start_of_turn>") and with_special[-1] == gemma.eot
    without = gemma.tokenize(turn, add_special=False, parse_special=False)
    assert gemma.token_id("<start_of_turn>") not in without
    # user-defined tokens ("\n", runs of spaces) split text even with parse_special=False
    assert gemma.token_id("\n") in without
    assert gemma.tokenize("", add_special=True) == [gemma.bos]
    assert gemma.tokenize("", add_special=False) == []
    assert smollm.tokenize("<|im_start|>", add_special=True, parse_special=True) == [1]
    assert gemma.tokenize(turn.encode(), False, True) == with_special


def test_token_lookups(smollm_path):
    vocab = vocab_of(smollm_path)
    assert vocab.token_id("<|im_end|>") == 2 and vocab.token_id(b"<|im_end|>") == 2
    assert vocab.token_id("no such token text") is None
    assert vocab.token_text(2) == "<|im_end|>"
    assert vocab.token_type(2) == TokenType.CONTROL and vocab.is_control(2)
    assert vocab.token_type(100) == TokenType.NORMAL and not vocab.is_control(100)
    assert vocab.token_attr(100) == TokenAttr.NORMAL
    assert vocab.token_score(100) == 0.0
    assert vocab.token_to_piece(2) == b"" and vocab.token_to_piece(2, special=True) == b"<|im_end|>"
    assert vocab.detokenize([1, 2], unparse_special=True) == "<|im_start|><|im_end|>"


@pytest.mark.parametrize("bad", [-1, 49152, 10**12])
def test_out_of_range_ids_raise(smollm_path, bad):
    vocab = vocab_of(smollm_path)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vocab.token_to_piece(bad)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vocab.detokenize([5, bad])
    with pytest.raises(TypeError):
        vocab.token_to_piece("5")
    with pytest.raises(TypeError):
        vocab.tokenize(5)


def test_detokenize_remove_special_and_lstrip(vocab_dir):
    spm = vocab_of(vocab_dir / "ggml-vocab-llama-spm.gguf")
    llama = LlamaVocab(vocab_dir / "ggml-vocab-llama-spm.gguf")
    ids = spm.tokenize(" Hello  world", add_special=True)
    assert ids[0] == spm.bos
    for remove in (False, True):
        for unparse in (False, True):
            want = llama.detokenize(ids, remove, unparse)
            assert spm.detokenize_bytes(ids, remove, unparse) == want
    assert spm.token_to_piece(ids[1], lstrip=1) == llama.token_to_piece(ids[1], 1)


def test_metadata_walker_matches_gguf_reader(tmp_path):
    """tests/_metadata.py reads (and writes) what the gguf package's GGUFReader reads."""
    from gguf import GGUFReader, GGUFValueType

    path = tmp_path / "small.gguf"
    write_metadata(path, {"general.architecture": "llama", "general.name": "tiny \u2581x",
                          "tokenizer.ggml.model": "llama", "tokenizer.ggml.bos_token_id": 1,
                          "tokenizer.ggml.add_bos_token": True, "x.eps": 1e-5,
                          "tokenizer.ggml.tokens": ["<unk>", "<s>", "\u2581a", "b"],
                          "tokenizer.ggml.scores": np.array([0, 0, -1.5, -2], np.float32),
                          "tokenizer.ggml.token_type": np.array([2, 3, 1, 1], np.int32),
                          "x.bytes": np.arange(5, dtype=np.uint8)})
    ours = read_metadata(path)
    reader = GGUFReader(str(path))
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert list(ours) == keys
    for key in keys:
        field = reader.fields[key]
        if field.types[0] == GGUFValueType.ARRAY and field.types[1] == GGUFValueType.STRING:
            assert ours[key] == [bytes(field.parts[i]).decode() for i in field.data]
        elif field.types[0] == GGUFValueType.ARRAY:
            want = np.concatenate([field.parts[i] for i in field.data])
            np.testing.assert_array_equal(ours[key], want)
        elif field.types[0] == GGUFValueType.STRING:
            assert ours[key] == bytes(field.parts[field.data[0]]).decode()
        else:
            assert ours[key] == field.parts[field.data[0]][0]


# ---- loading errors -------------------------------------------------------------------------

def spm_meta(tokens: list[str], **extra) -> dict:
    n = len(tokens)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.zeros(n, np.float32),
            "tokenizer.ggml.token_type": np.ones(n, np.int32), **extra}


BASE = ["<unk>", "<s>", "</s>", "a", "b", "ab", "\u2581"]


@pytest.mark.parametrize("meta, message", [
    ({}, "tokenizer.ggml.model"),
    (spm_meta(BASE, **{"tokenizer.ggml.model": "sentencepiece9"}),
     "unknown tokenizer: 'sentencepiece9'"),
    (spm_meta(BASE, **{"tokenizer.ggml.model": "t5",
                       "tokenizer.ggml.precompiled_charsmap": np.zeros(4, np.uint8)}), "charsmap"),
    ({**spm_meta(BASE), "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": ["a b"],
      "tokenizer.ggml.pre": "no-such-pre"}, "unknown pre-tokenizer type: 'no-such-pre'"),
    ({**spm_meta(BASE), "tokenizer.ggml.model": "gpt2"}, "merges"),
    ({**spm_meta(BASE), "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.merges": ["a b"],
      "tokenizer.ggml.pre": "kimi-k2"}, "not supported"),
    (spm_meta(BASE + ["a"]), "duplicate token in vocabulary: 'a' has ids 3 and 7"),
    ({**spm_meta(BASE), "tokenizer.ggml.tokens": "abc"}, "tokenizer.ggml.tokens"),
    ({**spm_meta(BASE), "tokenizer.ggml.tokens": []}, "empty"),
    ({**spm_meta(BASE), "tokenizer.ggml.scores": np.zeros(3, np.float32)}, "scores"),
    ({**spm_meta(BASE), "tokenizer.ggml.token_type": ["x"] * 7}, "token_type"),
    (spm_meta(BASE, **{"tokenizer.ggml.bos_token_id": "1"}), "bos_token_id"),
    (spm_meta(BASE, **{"tokenizer.ggml.add_bos_token": 1}), "add_bos_token"),
    (spm_meta(["a"]), "add_bos_token is true, but tokenizer.ggml.bos_token_id is not set"),
    (spm_meta(BASE, **{"general.name": "Phi-3 mini"}), "'<|endoftext|>'"),
])
def test_bad_metadata_raises_vocab_error(meta, message):
    with pytest.raises(VocabError, match=message.replace("|", "\\|").replace("(", "\\(")):
        Vocab.from_metadata(meta)


def test_vocab_error_hierarchy():
    assert issubclass(VocabError, ModelLoadError) and issubclass(VocabError, gguflm.Error)
    with pytest.raises(TypeError):
        Vocab()


def test_small_spm_vocab_behaviour():
    """A hand-made SPM vocabulary: BOS, space prefix, merging by score and byte fallback."""
    tokens = BASE + ["\u2581a", "<0x63>"]
    scores = np.array([0, 0, 0, -1, -1, -0.5, -2, -0.1, 0], np.float32)
    types = np.array([2, 3, 3, 1, 1, 1, 1, 1, 6], np.int32)
    vocab = Vocab.from_metadata({**spm_meta(tokens), "tokenizer.ggml.scores": scores,
                                 "tokenizer.ggml.token_type": types})
    assert vocab.tokenize("ab") == [1, 7, 4]  # "▁a" (-0.1) merges before "ab" (-0.5)
    assert vocab.tokenize("a", add_special=False) == [7]  # "▁a"
    assert vocab.tokenize("c", add_special=False) == [6, 8]  # "▁", then byte <0x63>
    assert vocab.detokenize([7, 8]) == "ac"  # the prefix space comes off again
    assert vocab.detokenize([1, 7, 8], remove_special=True) == " ac"  # llama.cpp keeps it here
    assert vocab.nl is None  # no <0x0A> and no "\n" token, no pad
