"""The vocabulary: tokens, special ids and the tokenizer, built from ``tokenizer.ggml.*`` metadata
the way llama.cpp's ``llama_vocab::impl::load`` builds it, defaults and text fallbacks included.

>>> vocab = Vocab.from_metadata(meta)
>>> ids = vocab.tokenize("Hello", add_special=True)
>>> vocab.detokenize(ids)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from enum import IntEnum, IntFlag
from typing import Any

import numpy as np

from gguflm._ext import tokenize as _tk
from gguflm.errors import TokenizeError, VocabError
from gguflm.tokenizers import bpe, hybriddna, plamo2, rwkv, spm, ugm, whitespace, wpm


class TokenType(IntEnum):
    """``tokenizer.ggml.token_type`` values (llama_token_type)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr(IntFlag):
    """llama.cpp's per-token attributes (llama_token_attr), derived from the type and the fixups."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


_TYPE_ATTR = {
    TokenType.UNDEFINED: TokenAttr.UNDEFINED,
    TokenType.NORMAL: TokenAttr.NORMAL,
    TokenType.UNKNOWN: TokenAttr.UNKNOWN,
    TokenType.CONTROL: TokenAttr.CONTROL,
    TokenType.USER_DEFINED: TokenAttr.USER_DEFINED,
    TokenType.UNUSED: TokenAttr.UNUSED,
    TokenType.BYTE: TokenAttr.BYTE,
}

# the attributes as plain ints for the per-token bookkeeping (IntFlag arithmetic is slow)
_UNKNOWN, _UNUSED, _NORMAL, _CONTROL, _USER_DEFINED, _BYTE = (int(a) for a in (
    TokenAttr.UNKNOWN, TokenAttr.UNUSED, TokenAttr.NORMAL, TokenAttr.CONTROL,
    TokenAttr.USER_DEFINED, TokenAttr.BYTE))
_LSTRIP, _RSTRIP = int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP)
_SPECIAL = _UNKNOWN | _CONTROL  # hidden in pieces unless asked for

# tokenizer.ggml.<key> -> Vocab attribute, in llama.cpp's order (the deprecated FIM keys last)
_SPECIAL_ID_KEYS = [
    ("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
    ("eom", "eom_token_id"), ("unk", "unknown_token_id"), ("sep", "seperator_token_id"),
    ("pad", "padding_token_id"), ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"),
    ("fim_suf", "fim_suf_token_id"), ("fim_mid", "fim_mid_token_id"),
    ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
    ("fim_sep", "fim_sep_token_id"), ("fim_pre", "prefix_token_id"),
    ("fim_suf", "suffix_token_id"), ("fim_mid", "middle_token_id"),
]

# texts llama.cpp takes a special token from when the file does not say (first found wins, in
# the iteration order of its std::unordered_map)
_BY_TEXT = {
    "eot": ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
            "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
            "<end_of_utterance>"],
    "eom": ["<|eom_id|>"],
    "fim_pre": ["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"],
    "fim_suf": ["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"],
    "fim_mid": ["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"],
    "fim_pad": ["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    "fim_rep": ["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    "fim_sep": ["<|file_sep|>"],
}

_EOG_TEXTS = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
              "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
              "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["]

_ALWAYS_RENDERED = ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"]  # gpt-oss

# tokenizer.ggml.model -> (type, default special ids)
_MODELS = {
    "llama": ("spm", {"bos": 1, "eos": 2, "unk": 0}),
    "bert": ("wpm", {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103}),
    "gpt2": ("bpe", {"bos": 11, "eos": 11}),
    "gemma4": ("bpe", {}),
    "t5": ("ugm", {"eos": 1, "unk": 2, "pad": 0}),
    "rwkv": ("rwkv", {}),
    "plamo2": ("plamo2", {"bos": 1, "eos": 2, "unk": 0, "pad": 3}),
    "hybriddna": ("bpe", {"bos": 11, "eos": 11}),   # gpt2's, with DNA spans
    "whitespace": ("bpe", {"bos": 11, "eos": 11}),  # gpt2's, on the words between white space
}
_NO_VOCAB_MODELS = {"no_vocab", "none"}   # token ids in and out, no text

_CLEAN_1 = re.compile(rb" (?=[?!.,])")          # " ?", " !", " .", " ,"
_CLEAN_2 = re.compile(rb" ' ")                   # a lone apostrophe between spaces
_CLEAN_3 = re.compile(rb" '(?=[sm]|re|ve)")      # " 's", " 'm", " 're", " 've"


def _meta_int(meta: Mapping[str, Any], key: str) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise VocabError(f"metadata key {key!r}: expected an integer, found {value!r}")
    return int(value)


def _meta_bool(meta: Mapping[str, Any], key: str) -> bool | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise VocabError(f"metadata key {key!r}: expected a bool, found {value!r}")
    return bool(value)


def _meta_array(meta: Mapping[str, Any], key: str, n: int, kinds: str) -> np.ndarray | None:
    value = meta.get(key)
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype.kind not in kinds:
        raise VocabError(f"metadata key {key!r}: expected a numeric array, found {arr.dtype}")
    if len(arr) < n:
        raise VocabError(f"metadata key {key!r} has {len(arr)} entries for {n} tokens")
    return arr[:n]


class Vocab:
    """A model's vocabulary and tokenizer (llama.cpp's ``llama_vocab``).

    Special ids are ``None`` where the model has none. Build with :meth:`from_metadata`.
    """

    bos: int | None
    eos: int | None
    eot: int | None
    eom: int | None
    unk: int | None
    sep: int | None
    pad: int | None
    mask: int | None
    nl: int | None
    fim_pre: int | None
    fim_suf: int | None
    fim_mid: int | None
    fim_pad: int | None
    fim_rep: int | None
    fim_sep: int | None

    def __init__(self) -> None:
        raise TypeError("use Vocab.from_metadata(meta)")

    # ---- loading ----------------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Vocab:
        """Build the vocabulary from GGUF metadata (key -> value, as the GGUF reader gives it).

        Raises
        ------
        VocabError
            A tokenizer key is missing or malformed, or names a tokenizer or pre-tokenizer that
            llama.cpp does not know (or gguflm does not implement).
        """
        self = object.__new__(cls)
        self._load(meta)
        return self

    def _load(self, meta: Mapping[str, Any]) -> None:
        model = meta.get("tokenizer.ggml.model")
        if not isinstance(model, str):
            raise VocabError("metadata key 'tokenizer.ggml.model' is missing: the file has no "
                             "tokenizer")
        if model in _NO_VOCAB_MODELS:
            self._load_none(meta)
            return
        if model not in _MODELS:
            raise VocabError(f"unknown tokenizer: {model!r}")
        self.type, defaults = _MODELS[model]
        pre_name = meta.get("tokenizer.ggml.pre") or ""
        if not isinstance(pre_name, str):
            raise VocabError("metadata key 'tokenizer.ggml.pre': expected a string, "
                             f"found {pre_name!r}")
        self._read_tokens(meta)
        n = self.n_tokens

        # type defaults, then the pre-tokenizer's, then the file's flags
        for name in ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask", "fim_pre", "fim_suf",
                     "fim_mid", "fim_pad", "fim_rep", "fim_sep"):
            setattr(self, name, defaults.get(name))
        self.add_space_prefix = self.type == "spm"
        self.add_bos = self.type in ("spm", "wpm")
        self.add_eos = self.type == "ugm"
        self.add_sep = self.type == "wpm"
        self.clean_spaces = self.type in ("bpe", "wpm")
        self.ignore_merges = False
        self.escape_whitespaces = self.type != "bpe"
        pre_spec = None
        if self.type == "bpe":
            if model == "gemma4":
                pre_name = "gemma4"
            self.pre = pre_name or "default"
            pre_spec = bpe.pre_tokenizer(self.pre)
            self.clean_spaces = pre_spec.clean_spaces
            self.ignore_merges = pre_spec.ignore_merges
            self.add_bos = pre_spec.add_bos
            self.add_sep = pre_spec.add_sep
            self.escape_whitespaces = pre_spec.spm_style
            if pre_spec.no_bos:
                self.bos = None
        else:
            self.pre = "default"
        self.add_space_prefix = _flag(meta, "add_space_prefix", self.add_space_prefix)
        self.remove_extra_whitespaces = _flag(meta, "remove_extra_whitespaces", False)

        self._build_engine(meta, pre_spec)
        # the normalizer's lower-casing (WordPiece, the whitespace tokenizer); off by default
        # with the whitespace pre-tokenizer
        self.lowercase = _flag(meta, "normalizer.lowercase", self.pre != "whitespace")
        if model == "hybriddna":
            self._engine = hybriddna.DnaEngine(self._engine, self.token_id)
            hybriddna.strip_markers(self._texts, self._strs, self.token_id("<oov>"))
        elif model == "whitespace":
            self._engine = whitespace.WhitespaceEngine(self._engine, self.lowercase)
        self.nl = self._linefeed()
        self._read_special_ids(meta)
        if self.type in ("ugm", "rwkv"):   # the unknown token the file names, if any
            self._engine.unk = -1 if self.unk is None else self.unk
        self.add_bos = _flag(meta, "add_bos_token", self.add_bos)
        self.add_eos = _flag(meta, "add_eos_token", self.add_eos)
        self.add_sep = _flag(meta, "add_sep_token", self.add_sep)
        if pre_spec is not None and pre_spec.gemma4:
            self.add_bos = True
        for flag, tok, key in (("add_bos", "bos", "bos"), ("add_eos", "eos", "eos"),
                               ("add_sep", "sep", "seperator")):
            if getattr(self, flag) and getattr(self, tok) is None:
                raise VocabError(f"tokenizer.ggml.{flag}_token is true, but "
                                 f"tokenizer.ggml.{key}_token_id is not set")
        self.strip_accents = _flag(meta, "normalizer.strip_accents", self.lowercase)
        if self.type == "wpm":
            self._engine = wpm.build_engine(self._table, self.unk, self._max_token_len,
                                            self.lowercase, self.strip_accents)

        self._detect_by_text()
        self._mark_unused()
        self._find_eog()
        # tokens split out of text before tokenizing, longest first (ties: lower id first)
        special = np.flatnonzero(np.asarray(self._attr) & (_CONTROL | _USER_DEFINED | _UNKNOWN))
        self._special_order = sorted(special.tolist(), key=lambda i: -len(self._texts[i]))
        self._pieces: list[bytes | None] = [None] * n  # pieces with special=True, on demand
        self._check_byte_tokens()
        self._fixup_attributes(meta)
        self._matchers: dict[bool, _tk.SpecialMatcher] = {}
        if self.type == "ugm" and any((a ^ b) & _USER_DEFINED
                                      for a, b in zip(self._load_attrs, self._attr)):
            self._build_engine(meta, None)  # user-defined tokens score 0: use the final attributes

    def _load_none(self, meta: Mapping[str, Any]) -> None:
        """llama.cpp's LLAMA_VOCAB_TYPE_NONE: no tokens' texts, no special tokens; ``{arch}.vocab_size``
        blank tokens (none without it). Tokenizing is refused; tokens render as nothing."""
        arch = meta.get("general.architecture")
        n = _meta_int(meta, f"{arch}.vocab_size") or 0
        self.type, self.pre, self.n_tokens = "none", "default", n
        for name, _ in _SPECIAL_ID_KEYS:
            setattr(self, name, None)
        self.nl = None
        self.add_space_prefix = self.add_bos = self.add_eos = self.add_sep = self.clean_spaces = False
        self.ignore_merges = self.remove_extra_whitespaces = self.lowercase = self.strip_accents = False
        self.escape_whitespaces = False
        self._strs, self._texts = [""] * n, [b""] * n
        self._table = _tk.TokenTable([])
        self._scores = np.zeros(n, np.float32)
        self._types = np.full(n, TokenType.UNDEFINED, np.int32)
        self._attr = [0] * n
        self._load_attrs = tuple(self._attr)
        self._max_token_len = 0
        self._engine = None
        self.eog_ids = frozenset()
        self._special_order = []
        self._pieces = [b""] * n
        self._matchers = {}

    def _read_tokens(self, meta: Mapping[str, Any]) -> None:
        tokens = meta.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, Sequence) or isinstance(tokens, (str, bytes)):
            raise VocabError("metadata key 'tokenizer.ggml.tokens' is missing or not a string "
                             "array")
        n = len(tokens)
        if n == 0:
            raise VocabError("metadata key 'tokenizer.ggml.tokens' is empty")
        strs = list(tokens)
        try:
            texts = [t.encode("utf-8", "surrogateescape") for t in strs]
        except AttributeError:
            i = next(i for i, t in enumerate(strs) if not isinstance(t, str))
            raise VocabError(f"tokenizer.ggml.tokens[{i}] is not a string: {strs[i]!r}") from None
        if min(map(len, texts)) == 0 or b"\0" in b"".join(texts):
            for i, t in enumerate(strs):
                t = strs[i] = t.split("\0", 1)[0]  # llama.cpp reads texts as C strings
                if not t:
                    strs[i] = f"[EMPTY_{i}]"  # and renames empty ones
                texts[i] = strs[i].encode("utf-8", "surrogateescape")
        self.n_tokens = n
        self._strs = strs
        self._texts = texts
        self._table = _tk.TokenTable(texts)
        if self._table.n_distinct != n:
            seen: dict[bytes, int] = {}
            for i, t in enumerate(texts):
                if t in seen:
                    raise VocabError(f"duplicate token in vocabulary: {strs[i]!r} has ids "
                                     f"{seen[t]} and {i}")
                seen[t] = i
        scores = _meta_array(meta, "tokenizer.ggml.scores", n, "fiu")
        self._scores = np.zeros(n, np.float32) if scores is None else scores.astype(np.float32)
        types = _meta_array(meta, "tokenizer.ggml.token_type", n, "iu")
        self._types = np.full(n, TokenType.NORMAL, np.int32) if types is None else \
            types.astype(np.int32)
        # a table of the 7 known types (one sized by the file's largest type id took gigabytes)
        type_attr = np.zeros(7, np.int64)
        for t, a in _TYPE_ATTR.items():
            type_attr[t] = a
        known = (self._types >= 0) & (self._types <= 6)
        self._attr = np.where(known, type_attr[np.clip(self._types, 0, 6)], 0).tolist()
        self._load_attrs = tuple(self._attr)  # as llama.cpp's tokenizer is built from them
        self._max_token_len = max(map(len, texts))

    def _build_engine(self, meta: Mapping[str, Any], pre_spec) -> None:
        if self.type == "spm":
            self._engine = spm.build_engine(self._table, self._scores, self.token_id,
                                            self.add_space_prefix)
        elif self.type == "bpe":
            merges = meta.get("tokenizer.ggml.merges")
            if merges is None:
                raise VocabError("cannot find tokenizer merges (tokenizer.ggml.merges) in the file")
            try:
                if isinstance(merges, (str, bytes)):
                    raise TypeError
                lines = [m.encode("utf-8", "surrogateescape").split(b"\0", 1)[0] for m in merges]
            except (TypeError, AttributeError):
                raise VocabError("metadata key 'tokenizer.ggml.merges' is not a string "
                                 "array") from None
            self._engine = bpe.build_engine(self._texts, lines, pre_spec, self.ignore_merges,
                                            self.token_id)
        elif self.type == "ugm":
            self._engine = ugm.build_engine(self._texts, self._load_attrs, self._attr, self._scores,
                                            self.unk, ugm.read_charsmap(meta.get(ugm.CHARSMAP_KEY)),
                                            self.add_space_prefix, self.remove_extra_whitespaces)
        elif self.type == "rwkv":
            self._engine = rwkv.build_engine(self._texts, self.unk)
        elif self.type == "plamo2":
            self._engine = plamo2.Plamo2Engine(self._texts, self._scores,
                                               [bool(a & _BYTE) for a in self._load_attrs])
        else:  # wpm: built once the normalizer flags are read
            self._engine = None

    def _linefeed(self) -> int | None:
        """The newline token, found before the file's special ids are read (as llama.cpp does)."""
        if self.type == "spm":
            tok = spm.byte_token(self.token_id, 0x0A)
            return tok if tok is not None else self.pad
        if self.type == "wpm":
            return self.pad
        ids = self._engine.encode(b"\n", _tk.SpecialMatcher([], [], [], []).partition(b"\n"))
        return ids[0] if ids else self.pad

    def _read_special_ids(self, meta: Mapping[str, Any]) -> None:
        n = self.n_tokens
        for name, key in _SPECIAL_ID_KEYS:
            if getattr(self, name) is not None and getattr(self, name) >= n:
                setattr(self, name, None)  # a default outside the vocabulary
            new = _meta_int(meta, "tokenizer.ggml." + key)
            if new is not None and 0 <= new < n:
                setattr(self, name, new)

    def _detect_by_text(self) -> None:
        """Fill missing EOT/EOM/FIM ids from token texts, marking the chosen tokens control."""
        wanted = {}
        for name, texts in _BY_TEXT.items():
            if getattr(self, name) is None:
                for t in texts:
                    tok = self.token_id(t)
                    if tok is not None:
                        wanted.setdefault(tok, []).append(name)
        if not wanted:
            return
        order = _tk.stdmap_order(self._texts)
        position = np.empty(self.n_tokens, np.int64)
        position[np.asarray(order)] = np.arange(self.n_tokens)
        for tok in sorted(wanted, key=lambda t: position[t]):
            for name in wanted[tok]:
                if getattr(self, name) is None:
                    setattr(self, name, tok)
                    self._attr[tok] |= _CONTROL

    def _mark_unused(self) -> None:
        for i in np.flatnonzero(np.asarray(self._attr) & _CONTROL).tolist():
            if b"unused" in self._texts[i].split(b"\0", 1)[0]:
                self._attr[i] |= _UNUSED

    def _find_eog(self) -> None:
        eog = {t for t in (self.fim_pad, self.fim_rep, self.fim_sep) if t is not None}
        for text in _EOG_TEXTS:
            tok = self.token_id(text)
            if tok is not None:
                eog.add(tok)
                self._attr[tok] |= _CONTROL
        for text in _ALWAYS_RENDERED:
            tok = self.token_id(text)
            if tok is not None:
                self._attr[tok] = _USER_DEFINED
        eog.update(t for t in (self.eos, self.eot, self.eom) if t is not None)
        texts = {self._texts[t]: t for t in eog}
        # harmony / solar-open chat formats: "<|end|>" ends a message, not the generation
        has_call = b"<|call|>" in texts or b"<|calls|>" in texts
        if b"<|end|>" in texts and has_call and (b"<|return|>" in texts or b"<|flush|>" in texts):
            eog.discard(texts[b"<|end|>"])
            self._attr[texts[b"<|end|>"]] = _USER_DEFINED
        # gemma4 / paddleocr: "</s>" is an ordinary token there
        if b"<|tool_response>" in texts and b"</s>" in texts:
            eog.discard(texts[b"</s>"])
            self._attr[texts[b"</s>"]] = _NORMAL
        self.eog_ids = frozenset(eog)

    def _check_byte_tokens(self) -> None:
        """Byte tokens render through their ``<0xXX>`` text; llama.cpp's load fails on one whose
        text is shorter than that (and on any in a WordPiece vocabulary)."""
        attr = np.asarray(self._attr)
        is_byte = (attr & _BYTE != 0) & (attr & (_SPECIAL | _USER_DEFINED | _NORMAL) == 0)
        for tok in np.flatnonzero(is_byte).tolist():
            if self.type == "wpm" or len(self._texts[tok]) < 3:
                raise VocabError(f"token {tok} {self._strs[tok]!r} is a byte token but not of the "
                                 f"form <0xXX>" + (" (WordPiece has no byte tokens)"
                                                    if self.type == "wpm" else ""))

    def _fixup_attributes(self, meta: Mapping[str, Any]) -> None:
        """llama.cpp's per-model lstrip/rstrip attributes, chosen by model and tokenizer names."""
        name = str(meta.get("general.name", "")).lower()
        pre = str(meta.get("tokenizer.ggml.pre", ""))
        arch = str(meta.get("general.architecture", ""))
        if any(x in pre for x in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
                any(x in arch for x in ("nomic-bert-moe", "jina-bert-v3")):
            self._set_attr_if_present("<mask>", _LSTRIP)
        elif "phi-3" in name or "phi3" in name:
            for tok in self._special_order:
                self._attr[tok] |= _RSTRIP
            for text, on in (("</s>", True), ("<unk>", False), ("<s>", False),
                             ("<|endoftext|>", False)):
                tok = self.token_id(text)
                if tok is None:
                    raise VocabError(f"model {meta.get('general.name')!r} is a Phi-3 model, whose "
                                     f"vocabulary must have the token {text!r}")
                self._attr[tok] = self._attr[tok] | _RSTRIP if on else self._attr[tok] & ~_RSTRIP
        elif "modern-bert" in name:
            self._set_attr_if_present("[MASK]", _LSTRIP)

    def _set_attr_if_present(self, text: str, attr: int) -> None:
        tok = self.token_id(text)
        if tok is not None:
            self._attr[tok] |= attr

    # ---- lookups ----------------------------------------------------------------------------

    def _check(self, tok: int) -> int:
        if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)):
            raise TypeError(f"token id must be an int, not {type(tok).__name__}")
        if not 0 <= tok < self.n_tokens:
            raise ValueError(f"token id {tok} is outside the vocabulary (0..{self.n_tokens - 1})")
        return int(tok)

    def token_id(self, text: str | bytes) -> int | None:
        """The id of the token whose text is exactly ``text``, or None."""
        raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
        return self._table.get(raw)

    def token_text(self, tok: int) -> str:
        """The token's text as stored in the file."""
        return self._strs[self._check(tok)]

    def token_type(self, tok: int) -> TokenType:
        """The token's type as stored in the file (NORMAL when the file stores none)."""
        t = int(self._types[self._check(tok)])
        return TokenType(t) if t in TokenType._value2member_map_ else TokenType.UNDEFINED

    def token_attr(self, tok: int) -> TokenAttr:
        """llama.cpp's attributes of the token (its type plus load-time fixups)."""
        return TokenAttr(self._attr[self._check(tok)])

    def token_score(self, tok: int) -> float:
        return float(self._scores[self._check(tok)])

    def is_control(self, tok: int) -> bool:
        return bool(self._attr[self._check(tok)] & _CONTROL)

    def is_eog(self, tok: int | None) -> bool:
        """Whether ``tok`` ends generation (EOS, EOT, EOM and the other end-of-generation ids)."""
        return tok in self.eog_ids

    # ---- text -> tokens ---------------------------------------------------------------------

    def _matcher(self, parse_special: bool) -> _tk.SpecialMatcher:
        matcher = self._matchers.get(parse_special)
        if matcher is None:
            ids = [t for t in self._special_order
                   if parse_special or not self._attr[t] & _SPECIAL]
            matcher = _tk.SpecialMatcher([self._texts[t] for t in ids], ids,
                                         [bool(self._attr[t] & _LSTRIP) for t in ids],
                                         [bool(self._attr[t] & _RSTRIP) for t in ids])
            self._matchers[parse_special] = matcher
        return matcher

    def tokenize(self, text: str | bytes, add_special: bool = True,
                 parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, as ``llama_tokenize`` gives them.

        Parameters
        ----------
        text
            A str, or UTF-8 bytes (invalid sequences are read as llama.cpp reads them).
        add_special
            Add BOS/EOS (WordPiece: CLS/SEP) where the model asks for them.
        parse_special
            Turn control-token texts into those tokens; user-defined tokens always are.

        Raises
        ------
        gguflm.errors.TokenizeError
            Text this vocabulary cannot tokenize (see the class); a ValueError too.
        """
        if isinstance(text, str):
            try:
                raw = text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise TokenizeError(f"the text holds a lone surrogate at character {exc.start}, "
                                    f"which UTF-8 cannot encode") from None
        elif isinstance(text, (bytes, bytearray, memoryview)):
            raw = bytes(text)
        else:
            raise TypeError(f"text must be str or bytes, not {type(text).__name__}")
        if self.type == "none":
            raise VocabError("the model has no vocabulary (tokenizer.ggml.model 'none'): it takes token "
                             "ids, not text")
        try:
            ids = self._engine.encode(raw, self._matcher(parse_special).partition(raw))
        except ValueError as exc:   # the engine's: a code point past U+10FFFF, a byte without a token
            raise TokenizeError(str(exc)) from None
        if -1 in ids:   # llama.cpp hands out its null token here (WPM, RWKV without an unknown token)
            raise TokenizeError("the text has a word or byte the vocabulary has no token for, and "
                                "the vocabulary has no unknown token")
        if self.type == "wpm":
            if add_special:
                ids = [self.bos, *ids, self.sep]
            return ids
        if add_special and self.add_bos:
            ids.insert(0, self.bos)
        if add_special and self.add_eos:
            ids.append(self.eos)
        return ids

    # ---- tokens -> text ---------------------------------------------------------------------

    def _piece(self, tok: int) -> bytes:
        """The token's text as it renders (llama.cpp's token_to_piece with special=true)."""
        piece = self._pieces[tok]
        if piece is not None:
            return piece
        attr = self._attr[tok]
        text = self._texts[tok]
        if self.type == "rwkv":   # every token renders as its unescaped bytes
            piece = rwkv.unescape(text)
        elif self.type == "plamo2":   # its text, or a byte token's byte
            byte = plamo2.byte_value(text) if attr & _BYTE else None
            piece = text if byte is None else bytes([byte])
        elif attr & (_SPECIAL | _USER_DEFINED):
            piece = text
        elif attr & _NORMAL:
            if self.type == "bpe" and not self.escape_whitespaces:
                piece = _tk.gpt2_text_to_bytes(text, False)
            else:
                piece = text.replace("\u2581".encode(), b" ")
        elif attr & _BYTE and self.type != "wpm":
            piece = bytes([_hex_byte(text[3:5])])
        else:
            piece = b""  # unused and undefined tokens render as nothing
        self._pieces[tok] = piece
        return piece

    def token_to_piece(self, tok: int, lstrip: int = 0, special: bool = False) -> bytes:
        """The bytes token ``tok`` renders as.

        Control and unknown tokens give ``b""`` unless ``special``; up to ``lstrip`` leading
        spaces are dropped. Raises ValueError for an id outside the vocabulary.
        """
        tok = self._check(tok)
        if not special and self._attr[tok] & _SPECIAL:
            return b""
        piece = self._piece(tok)
        if lstrip > 0:
            k = 0
            while k < lstrip and k < len(piece) and piece[k] == 0x20:
                k += 1
            piece = piece[k:]
        return piece

    def detokenize_bytes(self, ids: Iterable[int], remove_special: bool = False,
                         unparse_special: bool = False) -> bytes:
        """:meth:`detokenize` without the final UTF-8 decoding."""
        ids = [self._check(t) for t in ids]
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos:
            ids = ids[:-1]
        parts = [self.token_to_piece(t, 0, unparse_special) for t in ids]
        if parts and remove_space:
            parts[0] = self.token_to_piece(ids[0], 1, unparse_special)
        text = b"".join(parts)
        if self.clean_spaces:
            text = _CLEAN_3.sub(b"'", _CLEAN_2.sub(b"'", _CLEAN_1.sub(b"", text)))
        return text

    def detokenize(self, ids: Iterable[int], remove_special: bool = False,
                   unparse_special: bool = False) -> str:
        """The text of a token sequence, as ``llama_detokenize`` gives it.

        Parameters
        ----------
        ids
            Token ids; one outside the vocabulary raises ValueError.
        remove_special
            Drop a leading BOS and trailing EOS where the model adds them.
        unparse_special
            Render control tokens as their text instead of nothing.

        Bytes that are not valid UTF-8 (a sequence cut mid-character) become U+FFFD.
        """
        text = self.detokenize_bytes(ids, remove_special, unparse_special)
        return text.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"<Vocab {self.type}/{self.pre} n_tokens={self.n_tokens}>"


def _flag(meta: Mapping[str, Any], key: str, default: bool) -> bool:
    value = _meta_bool(meta, "tokenizer.ggml." + key)
    return default if value is None else value


def _hex_byte(digits: bytes) -> int:
    """strtol(digits, 16) & 0xFF the way llama.cpp reads byte tokens: stops at the first non-hex."""
    value = 0
    for c in digits:
        if not chr(c) in "0123456789abcdefABCDEF":
            break
        value = value * 16 + int(chr(c), 16)
    return value & 0xFF
