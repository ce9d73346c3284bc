"""Byte-pair encoding (``tokenizer.ggml.model`` = ``gpt2`` or ``gemma4``) and its pre-tokenizers.

``tokenizer.ggml.pre`` names a pre-tokenizer: a list of splitting steps, applied in order, each
cutting every word of the previous step into finer words (llama.cpp's ``unicode_regex_split``).
Three common steps are native (GPT-2's and Llama 3's hand-written splitters, and ``\\p{N}``); the
others are llama.cpp's regexes run through Python's ``re`` the way llama.cpp runs them through
``std::regex``: ``\\p{..}`` classes over text collapsed to one byte per code point, and the rest
over code points with non-ASCII white space mapped to U+000B.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gguflm._ext import tokenize as _tk
from gguflm.errors import VocabError

# llama.cpp's unicode category classes -> (collapsed byte, the ASCII members)
_CATEGORY_CLASSES = {
    "\\p{N}": (0xD1, b"0-9"),
    "\\p{L}": (0xD2, b"A-Za-z"),
    "\\p{P}": (0xD3, b"!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
    "\\p{M}": (0xD4, b""),
    "\\p{S}": (0xD5, b"\\$\\+<->^`\\|\\~"),
    "\\p{Lu}": (0xD2, b"A-Za-z"),
    "\\p{Ll}": (0xD2, b"A-Za-z"),
    "\\p{Lt}": (0xD2, b"A-Za-z"),
    "\\p{Lm}": (0xD2, b"A-Za-z"),
    "\\p{Lo}": (0xD2, b"A-Za-z"),
}


def _collapse_pattern(pattern: str) -> bytes:
    """Rewrite ``\\p{..}`` classes for the collapsed text, as llama.cpp does for std::regex."""
    if any(ord(c) >= 128 for c in pattern):
        raise VocabError(f"regex {pattern!r} mixes unicode categories and non-ASCII characters")
    out = bytearray()
    inside = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[" and (i == 0 or pattern[i - 1] != "\\"):
            out += b"["
            inside = True
        elif inside and c == "]" and pattern[i - 1] != "\\":
            out += b"]"
            inside = False
        elif pattern.startswith("\\p{", i) and i + 3 < len(pattern):
            close = pattern.find("}", i + 3)
            klass = _CATEGORY_CLASSES.get(pattern[i:close + 1]) if 0 <= close <= i + 10 else None
            if klass is None:
                out += c.encode()
            else:
                members = bytes([klass[0]]) + klass[1]
                out += members if inside else b"[" + members + b"]"
                i = close
        else:
            out += c.encode()
        i += 1
    return bytes(out)


def _end_anchors(pattern):
    """ECMAScript's ``$`` (no multiline) matches only at the end; Python's also before a final
    newline, so unescaped ``$`` outside classes becomes ``\\Z``."""
    dollar, end = ("$", "\\Z") if isinstance(pattern, str) else (b"$", b"\\Z")
    backslash, open_, close = ("\\", "[", "]") if isinstance(pattern, str) else (b"\\", b"[", b"]")
    out = []
    inside = escaped = False
    for i in range(len(pattern)):
        c = pattern[i:i + 1]
        if escaped:
            escaped = False
        elif c == backslash:
            escaped = True
        elif c == open_:
            inside = True
        elif c == close:
            inside = False
        elif c == dollar and not inside:
            c = end
        out.append(c)
    return pattern[:0].join(out)


class RegexSplit:
    """One llama.cpp pre-tokenizer regex: matches and the gaps between them become words."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self.collapsed = any(k in pattern for k in _CATEGORY_CLASSES)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "possible nested set" in classes
            if self.collapsed:
                self._re = re.compile(_end_anchors(_collapse_pattern(pattern)))
            else:
                self._re = re.compile(_end_anchors(pattern), re.ASCII)

    def __call__(self, text: _tk.CodepointText, words: Sequence[int]) -> list[int]:
        subject = text.collapsed() if self.collapsed else text.wide()
        out: list[int] = []
        start = 0
        for length in words:
            end = start + length
            prev = start
            for m in self._re.finditer(subject, start, end):
                if m.start() > prev:
                    out.append(m.start() - prev)
                if m.end() > m.start():
                    out.append(m.end() - m.start())
                prev = m.end()
            if end > prev:
                out.append(end - prev)
            start = end
        return out

    def __repr__(self) -> str:
        return f"RegexSplit({self.pattern!r})"


Step = int | Callable[[_tk.CodepointText, Sequence[int]], list[int]]

GPT2 = _tk.SPLIT_GPT2
LLAMA3 = _tk.SPLIT_LLAMA3
DIGITS = _tk.SPLIT_DIGITS

# llama.cpp's regex lists (llm_tokenizer_bpe), as written there
_QWEN2 = ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
          "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_QWEN35 = ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?"
           "[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
           "|\\s+(?!\\S)|\\s+")
# (code points NFC would change are escaped: U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A)
_DEEPSEEK_LLM = [
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
]
_DEEPSEEK_CODER = ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"]
_DEEPSEEK3 = [
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
_FALCON = ["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"]
_DEFAULT = ["[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"]
_PORO = " ?[^(\\s|.,!?…。，、।۔،)]+"
_TEKKEN = ("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
           "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
           "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_GPT4O = ("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
          "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
          "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
          "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
          "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_CHAMELEON = ["<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
              DIGITS, "[\\p{P}!-/:-@\\[-`{-~]", GPT2]
_BAILINGMOE = ("'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
               "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+")
_SEED_CODER = ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
               "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
               "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_LINES = "[^\\n]+|[\\n]+"


@dataclass(frozen=True)
class PreTokenizer:
    """A ``tokenizer.ggml.pre`` entry: its splitting steps and the vocabulary flags it sets."""

    steps: tuple
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False
    add_sep: bool = False
    no_bos: bool = False           # llama.cpp clears the default BOS id (chatglm)
    spm_style: bool = False        # spaces escaped as U+2581, raw UTF-8 symbols, <0xXX> bytes
    gemma4: bool = False           # newline-only words kept whole; BOS always added
    raw_bytes: bool = False        # raw UTF-8 symbols and <0xXX> bytes, spaces not escaped
    compiled: list = field(default_factory=list, compare=False, repr=False)

    def build_steps(self) -> list[Step]:
        if not self.compiled:
            self.compiled.extend(s if isinstance(s, int) else RegexSplit(s) for s in self.steps)
        return self.compiled


def _pre(steps, **flags) -> PreTokenizer:
    return PreTokenizer(tuple(steps), **flags)


_KEEP = {"clean_spaces": False}
_DIGITS_GPT2 = [DIGITS, GPT2]

# name -> pre-tokenizer, as llama.cpp's llama_vocab::impl::load maps tokenizer.ggml.pre
PRE_TOKENIZERS: dict[str, PreTokenizer] = {}
for _names, _spec in [
    (["default"], _pre(_DEFAULT)),
    (["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano"], _pre([LLAMA3], ignore_merges=True, add_bos=True)),
    (["dbrx", "smaug-bpe"], _pre([LLAMA3])),
    (["glm4", "chatglm-bpe"], _pre([LLAMA3], no_bos=True)),
    (["deepseek-llm"], _pre(_DEEPSEEK_LLM, **_KEEP)),
    (["deepseek-coder"], _pre(_DEEPSEEK_CODER, **_KEEP)),
    (["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"], _pre(_DEEPSEEK3, **_KEEP)),
    (["falcon"], _pre(_FALCON)),
    (["mpt", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
      "a.x-4.0", "mellum", "modern-bert", "exaone4", "olmo", "jais"], _pre([GPT2])),
    (["trillion", "granite-docling"], _pre([GPT2], **_KEEP)),
    (["jina-v1-en", "jina-v2-code", "roberta-bpe"], _pre([GPT2], add_sep=True)),
    (["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"], _pre(_DIGITS_GPT2)),
    (["command-r", "smollm"], _pre(_DIGITS_GPT2, **_KEEP)),
    (["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"],
     _pre([_QWEN2], **_KEEP)),
    (["stablelm2", "megrez"], _pre([_QWEN2])),
    (["qwen35"], _pre([_QWEN35], **_KEEP)),
    (["poro-chat"], _pre([_PORO], **_KEEP)),
    (["bloom", "gpt3-finnish"], _pre([_PORO])),
    (["viking"], _pre([_PORO, DIGITS], **_KEEP)),
    (["tekken"], _pre([_TEKKEN], clean_spaces=False, ignore_merges=True, add_bos=True)),
    (["chameleon"], _pre(_CHAMELEON, clean_spaces=False, add_bos=True)),
    (["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], _pre([_GPT4O], **_KEEP)),
    (["bailingmoe", "bailingmoe2", "llada-moe"], _pre([_BAILINGMOE], **_KEEP)),
    (["seed-coder"], _pre([_SEED_CODER], **_KEEP)),
    (["gemma4", "granite-embed-multi-311m"], _pre([_LINES], spm_style=True, gemma4=True)),
    (["sarvam-moe"], _pre([_LINES], clean_spaces=False, spm_style=True)),
    (["whitespace"], _pre(["\\S+"], raw_bytes=True)),
]:
    for _name in _names:
        PRE_TOKENIZERS[_name] = _spec

# known to llama.cpp but needing splitters or regex features gguflm does not replay
UNSUPPORTED_PRE = {"kimi-k2", "afmoe", "tiny_aya", "cohere2moe", "superbpe",
                   "youtu", "spark2_5", "minicpm5", "jais-2", "exaone-moe", "laguna", "ufakzeka",
                   "granite-embed-multi-97m"}


def pre_tokenizer(name: str) -> PreTokenizer:
    """The pre-tokenizer llama.cpp uses for ``tokenizer.ggml.pre`` = ``name``."""
    spec = PRE_TOKENIZERS.get(name)
    if spec is not None:
        return spec
    if name in UNSUPPORTED_PRE:
        raise VocabError(f"pre-tokenizer type {name!r} is not supported by gguflm")
    raise VocabError(f"unknown pre-tokenizer type: {name!r}")


def build_engine(tokens: list[bytes], merges: list[bytes], spec: PreTokenizer,
                 ignore_merges: bool, token_id: Callable[[bytes], int | None]) -> _tk.BpeEngine:
    """A BPE engine for the vocabulary; ``merges`` are the lines "left right" in rank order and
    ``token_id`` looks tokens up by their file text."""
    byte_encode = not (spec.spm_style or spec.raw_bytes)
    if byte_encode:  # a leftover byte becomes the tokens of its mapped text's single bytes
        fallback = [[tok for x in _tk.gpt2_byte_to_text(b)
                     if (tok := token_id(bytes([x]))) is not None] for b in range(256)]
    else:
        fallback = [[tok] if (tok := token_id(f"<0x{b:02X}>".encode())) is not None else []
                    for b in range(256)]
    return _tk.BpeEngine(tokens, merges, fallback, spec.build_steps(), byte_encode, ignore_merges,
                         spec.gemma4, spec.spm_style)
