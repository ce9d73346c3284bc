"""Quantize a GGUF model to another file type, byte for byte as llama.cpp's ``llama_model_quantize``.

``gguflm.quantize("model-f16.gguf", "model-q4_k_m.gguf", "Q4_K_M")`` writes the file llama.cpp's
``llama-quantize`` writes with the same options: the same per-tensor types (the mixes' rules for
attn_v, ffn_down, output, token_embd, the first and last layers, the fallbacks for rows that do
not fit a block), the same metadata in the same order, tensors in llama.cpp's order (by layer,
then by name), 32-byte alignment and zero padding. The rules are transcribed from llama.cpp's
``src/llama-quant.cpp``; the arithmetic is :mod:`gguflm.quants`, byte-exact with
``ggml_quantize_chunk``.

The file is written beside OUT under a temporary name and renamed when complete, so an
interrupted run leaves no partial OUT. Rows are quantized on ``nthread`` threads; every row is
quantized on its own, so the bytes do not depend on the thread count.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum, auto
from os import PathLike
from pathlib import Path
from typing import Any, Union

import numpy as np

from gguflm.errors import QuantizeError
from gguflm.ggml_types import (BLOCK_NUMBER, FILE_TYPE_GUESSED, FileType, GGMLType, guess_file_type,
                               weights_map_key)

_log = logging.getLogger(__name__)

PathArg = Union[str, "PathLike[str]"]
TypeArg = Union[str, GGMLType, None]

QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION
_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT: what llama.cpp's quantizer lays its output out with
_CHUNK_ELEMENTS = 32 * 512  # rows handed to one thread at a time, at least this many values

# llama-quantize's type names (QUANT_OPTIONS), in its order; aliases map to the _M mixes
FTYPE_NAMES: dict[str, FileType] = {
    "Q4_0": FileType.MOSTLY_Q4_0, "Q4_1": FileType.MOSTLY_Q4_1,
    "MXFP4_MOE": FileType.MOSTLY_MXFP4_MOE,
    "Q5_0": FileType.MOSTLY_Q5_0, "Q5_1": FileType.MOSTLY_Q5_1,
    "IQ2_XXS": FileType.MOSTLY_IQ2_XXS, "IQ2_XS": FileType.MOSTLY_IQ2_XS,
    "IQ2_S": FileType.MOSTLY_IQ2_S, "IQ2_M": FileType.MOSTLY_IQ2_M,
    "IQ1_S": FileType.MOSTLY_IQ1_S, "IQ1_M": FileType.MOSTLY_IQ1_M,
    "TQ1_0": FileType.MOSTLY_TQ1_0, "TQ2_0": FileType.MOSTLY_TQ2_0,
    "Q2_K": FileType.MOSTLY_Q2_K, "Q2_K_S": FileType.MOSTLY_Q2_K_S,
    "IQ3_XXS": FileType.MOSTLY_IQ3_XXS, "IQ3_S": FileType.MOSTLY_IQ3_S,
    "IQ3_M": FileType.MOSTLY_IQ3_M, "Q3_K": FileType.MOSTLY_Q3_K_M,
    "IQ3_XS": FileType.MOSTLY_IQ3_XS, "Q3_K_S": FileType.MOSTLY_Q3_K_S,
    "Q3_K_M": FileType.MOSTLY_Q3_K_M, "Q3_K_L": FileType.MOSTLY_Q3_K_L,
    "IQ4_NL": FileType.MOSTLY_IQ4_NL, "IQ4_XS": FileType.MOSTLY_IQ4_XS,
    "Q4_K": FileType.MOSTLY_Q4_K_M, "Q4_K_S": FileType.MOSTLY_Q4_K_S,
    "Q4_K_M": FileType.MOSTLY_Q4_K_M, "Q5_K": FileType.MOSTLY_Q5_K_M,
    "Q5_K_S": FileType.MOSTLY_Q5_K_S, "Q5_K_M": FileType.MOSTLY_Q5_K_M,
    "Q6_K": FileType.MOSTLY_Q6_K, "Q8_0": FileType.MOSTLY_Q8_0,
    "F16": FileType.MOSTLY_F16, "BF16": FileType.MOSTLY_BF16, "F32": FileType.ALL_F32,
    "COPY": FileType.ALL_F32,  # only copy tensors; the file keeps its file type
}

_F = FileType
_T = GGMLType

# llama_ftype_get_default_type: the type of a file type's ordinary matrices
_DEFAULT_TYPE: dict[FileType, GGMLType] = {
    _F.MOSTLY_Q4_0: _T.Q4_0, _F.MOSTLY_Q4_1: _T.Q4_1, _F.MOSTLY_Q5_0: _T.Q5_0,
    _F.MOSTLY_Q5_1: _T.Q5_1, _F.MOSTLY_Q8_0: _T.Q8_0, _F.MOSTLY_F16: _T.F16,
    _F.MOSTLY_BF16: _T.BF16, _F.ALL_F32: _T.F32, _F.MOSTLY_MXFP4_MOE: _T.MXFP4,
    _F.MOSTLY_Q2_K_S: _T.Q2_K, _F.MOSTLY_Q2_K: _T.Q2_K, _F.MOSTLY_IQ3_XS: _T.IQ3_S,
    _F.MOSTLY_Q3_K_S: _T.Q3_K, _F.MOSTLY_Q3_K_M: _T.Q3_K, _F.MOSTLY_Q3_K_L: _T.Q3_K,
    _F.MOSTLY_Q4_K_S: _T.Q4_K, _F.MOSTLY_Q4_K_M: _T.Q4_K, _F.MOSTLY_Q5_K_S: _T.Q5_K,
    _F.MOSTLY_Q5_K_M: _T.Q5_K, _F.MOSTLY_Q6_K: _T.Q6_K, _F.MOSTLY_TQ1_0: _T.TQ1_0,
    _F.MOSTLY_TQ2_0: _T.TQ2_0, _F.MOSTLY_IQ2_XXS: _T.IQ2_XXS, _F.MOSTLY_IQ2_XS: _T.IQ2_XS,
    _F.MOSTLY_IQ2_S: _T.IQ2_XS, _F.MOSTLY_IQ2_M: _T.IQ2_S, _F.MOSTLY_IQ3_XXS: _T.IQ3_XXS,
    _F.MOSTLY_IQ1_S: _T.IQ1_S, _F.MOSTLY_IQ1_M: _T.IQ1_M, _F.MOSTLY_IQ4_NL: _T.IQ4_NL,
    _F.MOSTLY_IQ4_XS: _T.IQ4_XS, _F.MOSTLY_IQ3_S: _T.IQ3_S, _F.MOSTLY_IQ3_M: _T.IQ3_S,
}

_PLAIN_TYPES = (_T.F32, _T.F16, _T.BF16, _T.F64, _T.I8, _T.I16, _T.I32, _T.I64)

# (architecture, block count) that llama.cpp calls a 70B model (its attn_v gets more bits);
# for llama only when the attention is grouped
_TYPE_70B = {("llama", 80), ("deci", 80), ("olmo", 80), ("qwen2", 80), ("jais2", 68)}

# types the tensors may not be quantized to without importance data
_NEEDS_IMATRIX = {_T.IQ3_XXS, _T.IQ2_XXS, _T.IQ2_XS, _T.IQ2_S, _T.IQ1_M, _T.IQ1_S}

# names (substrings, as llama.cpp tests them) of weights that are never quantized
_KEEP_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    *(f"time_mix_{w}.weight" for w in ("first", "w0", "w1", "w2", "v0", "v1", "v2", "a0", "a1",
                                       "a2", "g1", "g2", "decay_w1", "decay_w2", "lerp_fused")),
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
    ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_KEEP_GLM5_NEXT = (
    "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight",
    "ssm_g_b.weight", "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight",
    "attn_v_b.weight",
)



class _Cat(Enum):
    """Broad tensor roles the type rules look at (llama.cpp's ``tensor_category``)."""

    TOKEN_EMBD = auto()
    ATTENTION_Q = auto()
    ATTENTION_V = auto()
    ATTENTION_K = auto()
    ATTENTION_QKV = auto()
    ATTENTION_KV_B = auto()
    ATTENTION_OUTPUT = auto()
    FFN_UP = auto()
    FFN_GATE = auto()
    FFN_DOWN = auto()
    OUTPUT = auto()
    OTHER = auto()


def _category(name: str) -> _Cat:
    if name == "output.weight":
        return _Cat.OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return _Cat.TOKEN_EMBD
    for part, cat in (("attn_qkv.weight", _Cat.ATTENTION_QKV), ("attn_kv_b.weight", _Cat.ATTENTION_KV_B),
                      ("attn_v.weight", _Cat.ATTENTION_V), ("attn_k.weight", _Cat.ATTENTION_K),
                      ("attn_q.weight", _Cat.ATTENTION_Q), ("attn_output.weight", _Cat.ATTENTION_OUTPUT),
                      ("ffn_up", _Cat.FFN_UP), ("ffn_gate", _Cat.FFN_GATE), ("ffn_down", _Cat.FFN_DOWN)):
        if part in name:
            return cat
    return _Cat.OTHER


_ATTN_V_LIKE = (_Cat.ATTENTION_V, _Cat.ATTENTION_QKV, _Cat.ATTENTION_KV_B)


def parse_ftype(name: str | int | FileType) -> tuple[FileType, bool]:
    """A llama-quantize type name (``"Q4_K_M"``, ``"q4_k"``, ``"COPY"``) or ``llama_ftype``
    number → (file type, only copy)."""
    if isinstance(name, FileType):
        return name, False
    if isinstance(name, str) and name.upper() in FTYPE_NAMES:
        return FTYPE_NAMES[name.upper()], name.upper() == "COPY"
    try:
        number = int(name)
    except (TypeError, ValueError):
        number = None
    for ftype in FTYPE_NAMES.values():
        if ftype == number:
            return ftype, False
    raise ValueError(f"unknown file type {name!r}; known: {', '.join(FTYPE_NAMES)}")


def _ggml_type(t: TypeArg, what: str) -> GGMLType | None:
    if t is None or isinstance(t, GGMLType):
        return t
    try:
        return GGMLType[str(t).upper()]
    except KeyError:
        raise ValueError(f"{what}: unknown ggml type {t!r}") from None


def _is_quantized(t: GGMLType) -> bool:
    return t not in _PLAIN_TYPES


def _n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: dimensions up to the last one larger than 1 (at least 1)."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return max(n, 1)


def _cmod(a: int, b: int) -> int:
    """C's ``a % b`` (the sign of ``a``)."""
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _use_more_bits(i_layer: int, n_layer: int) -> bool:
    return (i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8
            or _cmod(i_layer - n_layer // 8, 3) == 2)


@dataclass(frozen=True)
class _Hparams:
    """What the type rules read of the model (llama.cpp's hparams after loading)."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int
    is_70b: bool

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @classmethod
    def of(cls, metadata: Mapping[str, Any]) -> _Hparams:
        arch = metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise QuantizeError("the file has no general.architecture")

        def first(key: str, default: int) -> int:
            value = metadata.get(f"{arch}.{key}", default)
            if isinstance(value, (list, np.ndarray)):
                value = value[0] if len(value) else default
            return int(value)

        n_layer = first("block_count", 0)
        if n_layer <= 0:
            raise QuantizeError(f"the file has no {arch}.block_count")
        n_head = first("attention.head_count", 0)
        n_head_kv = first("attention.head_count_kv", n_head)
        n_expert = first("expert_count", 0)
        is_70b = (arch, n_layer) in _TYPE_70B and (arch != "llama" or n_head != n_head_kv)
        return cls(arch, n_layer, n_head, n_head_kv, n_expert, is_70b)


@dataclass
class _Options:
    ftype: FileType
    only_copy: bool
    pure: bool
    quantize_output: bool
    output_type: GGMLType | None
    embedding_type: GGMLType | None
    overrides: list[tuple[re.Pattern[str], GGMLType]]
    has_imatrix: bool


def _allows_quantization(name: str, shape: tuple[int, ...], arch: str, opt: _Options) -> bool:
    """tensor_allows_quantization: 2-D and 3-D weights, not norms, gates, small tables..."""
    if opt.only_copy or _n_dims(shape) < 2:
        return False
    if not name.endswith("weight"):
        return False
    if not opt.quantize_output and name == "output.weight":
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    if any(part in name for part in _KEEP_SUBSTRINGS):
        return False
    if arch == "glm5-next" and any(part in name for part in _KEEP_GLM5_NEXT):
        return False
    return True


class _TypeRules:
    """llama_tensor_get_type with its state: called once per tensor, in file order."""

    def __init__(self, hp: _Hparams, opt: _Options, names: Sequence[str]) -> None:
        self.hp, self.opt = hp, opt
        self.categories = [_category(n) for n in names]
        self.n_attention_wv = sum(c in _ATTN_V_LIKE for c in self.categories)
        self.tied_embeddings = _Cat.OUTPUT not in self.categories
        self.n_layer = hp.n_layer  # n_ffn_down = n_ffn_gate = n_ffn_up
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self.n_fallback = 0
        self.fallbacks: list[str] = []

    def choose(self, name: str, shape: tuple[int, ...], cur: GGMLType, cat: _Cat) -> GGMLType:
        opt = self.opt
        if not _allows_quantization(name, shape, self.hp.arch, opt):
            return cur
        if opt.embedding_type is not None and cat is _Cat.TOKEN_EMBD:
            named = name == "per_layer_token_embd.weight" and any(
                p.search(name) for p, _ in opt.overrides)
            if not named:
                return opt.embedding_type
        if opt.output_type is not None and cat is _Cat.OUTPUT:
            return opt.output_type
        new = _DEFAULT_TYPE[opt.ftype]
        if not _is_quantized(new):
            return new
        manual = False
        for pattern, qtype in opt.overrides:
            if pattern.search(name):
                new, manual = qtype, True
                break
        if not manual and not opt.pure:
            new = self._mix(new, name, shape, cat)
        return self._fallback(name, shape, new)

    def _fallback(self, name: str, shape: tuple[int, ...], target: GGMLType) -> GGMLType:
        """tensor_type_fallback: a type whose block fits the rows."""
        ncols, qk = shape[0], target.block_size
        if ncols % qk == 0:
            return target
        self.n_fallback += 1
        if target in (_T.IQ1_S, _T.IQ1_M, _T.IQ2_XXS, _T.IQ2_XS, _T.IQ2_S, _T.IQ3_XXS, _T.IQ3_S,
                      _T.IQ4_XS):
            out = _T.IQ4_NL
        elif target in (_T.Q2_K, _T.Q3_K, _T.TQ1_0, _T.TQ2_0):
            out = _T.Q4_0
        elif target is _T.Q4_K:
            out = _T.Q5_0
        elif target is _T.Q5_K:
            out = _T.Q5_1
        elif target is _T.Q6_K:
            out = _T.Q8_0
        elif qk <= 32:
            out = target
        else:
            raise QuantizeError(f"no tensor type fallback is defined for type {target.name}")
        if ncols % out.block_size:
            out = _T.F16
        self.fallbacks.append(f"{name}: {ncols} columns not divisible by {qk} ({target.name}) "
                              f"-> {out.name}")
        _log.info("%s", self.fallbacks[-1])
        return out

    def _layer(self, counter: int, name: str) -> int:
        if max(1, self.hp.n_expert) > 1:  # experts are not consecutive: read the layer off the name
            match = BLOCK_NUMBER.match(name)
            if not match:
                raise QuantizeError(f"Failed to determine layer for tensor {name}")
            i_layer = int(match[1])
            if not 0 <= i_layer < self.n_layer:
                raise QuantizeError(f"Bad layer {i_layer} for tensor {name}. Must be in [0, {self.n_layer})")
            return i_layer
        return counter

    def _mix(self, new: GGMLType, name: str, shape: tuple[int, ...], cat: _Cat) -> GGMLType:
        """llama_tensor_get_type_impl: the file type's choice for this tensor."""
        hp, ftype = self.hp, self.opt.ftype
        n_gqa, n_expert, arch = hp.n_gqa, hp.n_expert, hp.arch
        low_iq = (_F.MOSTLY_IQ2_XXS, _F.MOSTLY_IQ2_XS, _F.MOSTLY_IQ1_S, _F.MOSTLY_IQ2_S,
                  _F.MOSTLY_IQ2_M, _F.MOSTLY_IQ1_M)
        if arch == "glm5-next" and any(p in name for p in ("attn_q_a", "attn_q_b", "nextn.eh_proj")):
            if new not in (_T.F32, _T.BF16, _T.F16):
                return _T.Q8_0
        if cat is _Cat.OUTPUT or (self.tied_embeddings and cat is _Cat.TOKEN_EMBD):
            if self.opt.output_type is not None:
                return self.opt.output_type
            if ftype is _F.MOSTLY_MXFP4_MOE:
                return _T.Q8_0
            if arch == "falcon" or shape[0] % new.block_size:
                return _T.Q8_0
            if ftype in (_F.MOSTLY_IQ2_XXS, _F.MOSTLY_IQ2_XS, _F.MOSTLY_IQ3_XXS, _F.MOSTLY_IQ1_S,
                         _F.MOSTLY_IQ2_S, _F.MOSTLY_IQ2_M, _F.MOSTLY_IQ1_M):
                return _T.Q5_K
            return new if new is _T.Q8_0 else _T.Q6_K
        if ftype is _F.MOSTLY_MXFP4_MOE:
            expert_role = cat in (_Cat.FFN_UP, _Cat.FFN_GATE, _Cat.FFN_DOWN)
            stacked = len(shape) > 2 and shape[2] > 1
            if stacked and (arch != "bailingmoe3" or expert_role):
                return _T.MXFP4
            return _T.Q8_0
        if cat is _Cat.TOKEN_EMBD:
            if self.opt.embedding_type is not None:
                return self.opt.embedding_type
            if ftype in (_F.MOSTLY_IQ2_XXS, _F.MOSTLY_IQ2_XS, _F.MOSTLY_IQ1_S, _F.MOSTLY_IQ1_M):
                return _T.Q2_K
            if ftype in (_F.MOSTLY_IQ2_S, _F.MOSTLY_IQ2_M, _F.MOSTLY_IQ3_XXS):
                return _T.IQ3_S
            if ftype in (_F.MOSTLY_TQ1_0, _F.MOSTLY_TQ2_0):
                return _T.Q4_K
            return new
        iq2_s_m = ftype in (_F.MOSTLY_IQ2_S, _F.MOSTLY_IQ2_M)
        if ftype in low_iq:
            if cat in _ATTN_V_LIKE:
                if n_gqa >= 4 or n_expert >= 4:
                    new = _T.Q4_K
                else:
                    new = _T.IQ3_S if iq2_s_m else _T.Q2_K
                self.i_attention_wv += 1
            elif n_expert == 8 and cat is _Cat.ATTENTION_K:
                new = _T.Q4_K
            elif cat is _Cat.FFN_DOWN:
                if self.i_ffn_down < self.n_layer // 8:
                    new = _T.IQ3_S if iq2_s_m else _T.Q2_K
                self.i_ffn_down += 1
            elif cat is _Cat.ATTENTION_OUTPUT:
                if n_expert == 8:
                    new = _T.Q5_K
                elif ftype in (_F.MOSTLY_IQ1_S, _F.MOSTLY_IQ1_M):
                    new = _T.IQ2_XXS
                elif iq2_s_m:
                    new = _T.IQ3_S
            return new
        if cat in _ATTN_V_LIKE:
            has_im = self.opt.has_imatrix
            if ftype is _F.MOSTLY_Q2_K:
                new = _T.Q4_K if n_gqa >= 4 else _T.Q3_K
            elif ftype is _F.MOSTLY_Q2_K_S and n_gqa >= 4:
                new = _T.Q4_K
            elif ftype is _F.MOSTLY_IQ3_XXS:
                new = _T.Q4_K if n_gqa >= 4 else (_T.IQ3_S if not has_im else _T.IQ3_XXS)
            elif ftype in (_F.MOSTLY_IQ3_XS, _F.MOSTLY_IQ3_S) and n_gqa >= 4:
                new = _T.Q4_K
            elif ftype is _F.MOSTLY_IQ3_M:
                new = _T.Q4_K
            elif ftype is _F.MOSTLY_Q3_K_M:
                new = _T.Q5_K if self.i_attention_wv < 2 else _T.Q4_K
            elif ftype is _F.MOSTLY_Q3_K_L:
                new = _T.Q5_K
            elif ftype in (_F.MOSTLY_IQ4_NL, _F.MOSTLY_IQ4_XS) and n_gqa >= 4:
                new = _T.Q5_K
            elif (ftype in (_F.MOSTLY_Q4_K_M, _F.MOSTLY_Q5_K_M)
                  and _use_more_bits(self.i_attention_wv, self.n_attention_wv)):
                new = _T.Q6_K
            elif ftype is _F.MOSTLY_Q4_K_S and self.i_attention_wv < 4:
                new = _T.Q5_K
            if hp.is_70b and new in (_T.Q3_K, _T.Q4_K):
                new = _T.Q5_K
            if n_expert == 8:
                new = _T.Q8_0
            self.i_attention_wv += 1
        elif cat is _Cat.ATTENTION_K:
            if n_expert == 8:
                new = _T.Q8_0
            elif ftype is _F.MOSTLY_IQ3_XS:
                new = _T.IQ3_XXS
            elif ftype is _F.MOSTLY_IQ3_XXS:
                new = _T.IQ2_S
        elif cat is _Cat.ATTENTION_Q:
            if ftype is _F.MOSTLY_IQ3_XS:
                new = _T.IQ3_XXS
            elif ftype is _F.MOSTLY_IQ3_XXS:
                new = _T.IQ2_S
        elif cat is _Cat.FFN_DOWN:
            new = self._ffn_down(new, name)
            self.i_ffn_down += 1
        elif cat is _Cat.ATTENTION_OUTPUT:
            if arch != "falcon":
                if n_expert == 8:
                    if ftype in (_F.MOSTLY_Q2_K, _F.MOSTLY_IQ3_XS, _F.MOSTLY_IQ3_XXS,
                                 _F.MOSTLY_Q3_K_S, _F.MOSTLY_Q3_K_M, _F.MOSTLY_IQ4_NL,
                                 _F.MOSTLY_Q4_K_S, _F.MOSTLY_Q4_K_M, _F.MOSTLY_IQ3_S,
                                 _F.MOSTLY_IQ3_M, _F.MOSTLY_IQ4_XS):
                        new = _T.Q5_K
                else:
                    new = {_F.MOSTLY_Q2_K: _T.Q3_K, _F.MOSTLY_IQ3_XXS: _T.IQ3_S,
                           _F.MOSTLY_Q3_K_M: _T.Q4_K, _F.MOSTLY_Q3_K_L: _T.Q5_K,
                           _F.MOSTLY_IQ3_M: _T.Q4_K}.get(ftype, new)
            elif ftype is _F.MOSTLY_Q3_K_L:
                new = _T.Q4_K
        elif cat is _Cat.ATTENTION_QKV:
            if ftype in (_F.MOSTLY_Q3_K_M, _F.MOSTLY_Q3_K_L, _F.MOSTLY_IQ3_M):
                new = _T.Q4_K
            elif ftype is _F.MOSTLY_Q4_K_M:
                new = _T.Q5_K
            elif ftype is _F.MOSTLY_Q5_K_M:
                new = _T.Q6_K
        elif cat in (_Cat.FFN_GATE, _Cat.FFN_UP):
            counter = self.i_ffn_gate if cat is _Cat.FFN_GATE else self.i_ffn_up
            i_layer, n_layer = self._layer(counter, name), self.n_layer
            if ftype is _F.MOSTLY_IQ3_XS and n_layer // 8 <= i_layer < 7 * n_layer // 8:
                new = _T.IQ3_XXS
            if cat is _Cat.FFN_GATE:
                self.i_ffn_gate += 1
            else:
                self.i_ffn_up += 1
        return new

    def _ffn_down(self, new: GGMLType, name: str) -> GGMLType:
        ftype, arch, has_im = self.opt.ftype, self.hp.arch, self.opt.has_imatrix
        i_layer, n_layer = self._layer(self.i_ffn_down, name), self.n_layer
        early = i_layer < n_layer // 8
        if ftype is _F.MOSTLY_Q2_K:
            return _T.Q3_K
        if ftype is _F.MOSTLY_Q2_K_S:
            return _T.Q4_K if early else new
        if ftype is _F.MOSTLY_IQ3_XXS and not has_im:
            return _T.Q4_K if early else _T.Q3_K
        if ftype is _F.MOSTLY_Q3_K_M:
            if i_layer < n_layer // 16:
                return _T.Q5_K
            return _T.Q4_K if arch != "falcon" or _use_more_bits(i_layer, n_layer) else _T.Q3_K
        if ftype is _F.MOSTLY_IQ3_M and (early or (self.hp.n_expert == 8
                                                   and _use_more_bits(i_layer, n_layer))):
            return _T.Q4_K
        if ftype is _F.MOSTLY_Q3_K_L:
            return _T.Q4_K if arch == "falcon" else _T.Q5_K
        if ftype is _F.MOSTLY_Q4_K_M:
            if arch == "falcon":
                if i_layer < n_layer // 16:
                    return _T.Q6_K
                return _T.Q5_K if _use_more_bits(i_layer, n_layer) else _T.Q4_K
            return _T.Q6_K if _use_more_bits(i_layer, n_layer) else new
        if early and ftype in (_F.MOSTLY_IQ4_NL, _F.MOSTLY_IQ4_XS) and not has_im:
            return _T.Q5_K
        if ftype is _F.MOSTLY_Q5_K_M and _use_more_bits(i_layer, n_layer):
            return _T.Q6_K
        if ftype is _F.MOSTLY_Q4_K_S and arch != "falcon" and early:
            return _T.Q5_K
        if ftype in (_F.MOSTLY_Q4_0, _F.MOSTLY_Q5_0) and has_im and early:
            return _T.Q4_1 if ftype is _F.MOSTLY_Q4_0 else _T.Q5_1
        return new


def _requires_imatrix(name: str, dst: GGMLType, ftype: FileType) -> bool:
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    return dst in _NEEDS_IMATRIX or (dst is _T.Q2_K and ftype is _F.MOSTLY_Q2_K_S)


# ---- the plan: every tensor's type, before anything is written


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of the output: its name, ggml-order shape, type before and after."""

    name: str
    shape: tuple[int, ...]
    src_type: GGMLType
    dst_type: GGMLType
    part: int  # output part (``keep_split``), else 0

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def src_bytes(self) -> int:
        return self.n_elements // self.src_type.block_size * self.src_type.type_size

    @property
    def dst_bytes(self) -> int:
        return self.n_elements // self.dst_type.block_size * self.dst_type.type_size


@dataclass
class QuantizeResult:
    """What :func:`quantize` did: paths written, sizes and bits per weight before and after."""

    paths: list[Path]
    ftype: int
    tensors: list[TensorPlan]
    size_before: int
    size_after: int
    n_elements: int
    seconds: float
    fallbacks: list[str] = field(default_factory=list)

    @property
    def bpw_before(self) -> float:
        return self.size_before * 8.0 / self.n_elements if self.n_elements else 0.0

    @property
    def bpw_after(self) -> float:
        return self.size_after * 8.0 / self.n_elements if self.n_elements else 0.0

    def summary(self) -> str:
        """llama.cpp's closing lines: model and quant size in MiB and bits per weight."""
        mib = 1024.0 * 1024.0
        return (f"model size  = {self.size_before / mib:8.2f} MiB ({self.bpw_before:.2f} BPW)\n"
                f"quant size  = {self.size_after / mib:8.2f} MiB ({self.bpw_after:.2f} BPW)\n"
                f"{len(self.tensors)} tensors in {self.seconds:.2f} s")


def _ordered(tensors: list[Any], keep_split: bool) -> list[Any]:
    """llama.cpp's weights map order: by layer number (none first), then by name's bytes; with
    keep_split by input part, then by position in the part."""
    if keep_split:
        return sorted(tensors, key=lambda t: (t.part, t.offset))

    return sorted(tensors, key=lambda t: weights_map_key(t.name))


_BLK = re.compile(r"blk\.(\d+)\.")


def _pruned(tensors: list[Any], prune: list[int]) -> tuple[int | None, list[tuple[Any, str]]]:
    """llama.cpp's remap_layer: drop the blocks in ``prune`` and number the rest from 0 up, in
    the tensors' order; (the new block count or None, [(tensor, its new name)])."""
    if not prune:
        return None, [(t, t.name) for t in tensors]
    mapped: dict[int, int | None] = {}
    next_id = 0
    out = []
    for t in tensors:
        match = _BLK.search(t.name)
        if match is None:
            out.append((t, t.name))
            continue
        blk = int(match[1])
        if blk not in mapped:
            if blk in prune:
                mapped[blk] = None
            elif blk < prune[0]:
                mapped[blk], next_id = blk, blk + 1
            else:
                mapped[blk], next_id = next_id, next_id + 1
        if mapped[blk] is not None:
            out.append((t, f"{t.name[:match.start(1)]}{mapped[blk]}{t.name[match.end(1):]}"))
    return next_id, out


def _guessed_ftype(tensors: list[Any], metadata: Mapping[str, Any]) -> int:
    """llama_model_loader's ftype: general.file_type, else guessed from the commonest type."""
    if "general.file_type" in metadata:
        return int(metadata["general.file_type"])
    return int(guess_file_type((t.name, t.type) for t in tensors)) | FILE_TYPE_GUESSED


def _override_entry(key: str, value: Any) -> tuple[Any, Any]:
    """A KV override as llama.cpp's quantizer stores it: int → UINT32 of |value|, float →
    FLOAT32, bool → BOOL, str → STRING."""
    from gguflm.gguf.constants import GGUFValueType as V

    if isinstance(value, (bool, np.bool_)):
        return bool(value), V.BOOL
    if isinstance(value, (int, np.integer)):
        return abs(int(value)) & 0xFFFFFFFF, V.UINT32
    if isinstance(value, (float, np.floating)):
        return float(value), V.FLOAT32
    if isinstance(value, str):
        return value, V.STRING
    raise TypeError(f"override {key!r}: value must be bool, int, float or str, got {type(value).__name__}")


# ---- the work


class _Quantizer:
    """Quantizes one tensor's rows in chunks on a thread pool (the kernels release the GIL)."""

    def __init__(self, pool: ThreadPoolExecutor | None, n_threads: int) -> None:
        self.pool = pool
        self.n_threads = n_threads

    def run(self, info: Any, dst: GGMLType, weights: np.ndarray | None) -> np.ndarray:
        from gguflm import quants as q

        n_per_row = info.shape[0]
        n_rows = info.n_elements // n_per_row
        rows_per_expert = info.shape[1] if len(info.shape) > 1 else 1
        src = np.asarray(info.data).reshape(n_rows, -1)
        out = np.empty((n_rows, dst.row_bytes(n_per_row)), dtype=np.uint8)
        fmt = q.get(dst)
        # a few spans per thread, each at least _CHUNK_ELEMENTS values (rows are independent:
        # the bytes do not depend on the split)
        chunk = max(-(-_CHUNK_ELEMENTS // n_per_row), -(-rows_per_expert // (4 * self.n_threads)))

        def work(r0: int, r1: int) -> None:
            x = _to_f32(info.type, src[r0:r1], n_per_row)
            if not np.isfinite(x).all():
                raise QuantizeError(f"tensor {info.name!r} holds NaN or infinite values")
            # one importance vector per expert; spans never cross an expert
            fmt.quantize(x, None if weights is None else weights[r0 // rows_per_expert], out=out[r0:r1])

        spans = []
        for e0 in range(0, n_rows, rows_per_expert):
            e1 = min(n_rows, e0 + rows_per_expert)
            spans += [(r, min(e1, r + chunk)) for r in range(e0, e1, chunk)]
        if self.pool is None or len(spans) == 1:
            for span in spans:
                work(*span)
        else:
            futures = [self.pool.submit(work, *span) for span in spans]
            for f in futures:
                f.result()
        return out


def _to_f32(t: GGMLType, rows: np.ndarray, n_per_row: int) -> np.ndarray:
    """Source rows as float32, as llama.cpp converts them before quantizing (F16 and BF16 widen
    exactly; block types dequantize as ggml's to_float)."""
    from gguflm import quants as q

    if t is _T.F32:
        return np.ascontiguousarray(rows, dtype=np.float32)
    if t not in (_T.F16, _T.BF16) and not _is_quantized(t):
        raise QuantizeError(f"cannot dequantize/convert tensor type {t.name}")
    return q.get(t).dequantize(np.ascontiguousarray(rows), n_per_row)


def plan(src: PathArg, ftype: str | int | FileType, **options: Any) -> list[TensorPlan]:
    """Every tensor's output type, without writing anything (llama-quantize's ``--dry-run``).
    Takes :func:`quantize`'s options."""
    from gguflm.gguf import GGUFReader

    with GGUFReader(src) as reader:
        return _Job(reader, ftype, **options).plans


class _Job:
    """The decisions of one quantization: options, metadata, tensor order and types."""

    def __init__(self, reader: Any, ftype: str | int | FileType, *,
                 imatrix: PathArg | Mapping[str, np.ndarray] | None = None,
                 include_weights: Sequence[str] = (), exclude_weights: Sequence[str] = (),
                 allow_requantize: bool = False, leave_output_tensor: bool = False,
                 pure: bool = False, output_tensor_type: TypeArg = None,
                 token_embedding_type: TypeArg = None,
                 tensor_types: Sequence[tuple[str, TypeArg]] | Mapping[str, TypeArg] = (),
                 kv_overrides: Mapping[str, bool | int | float | str] | None = None,
                 keep_split: bool = False, prune_layers: Sequence[int] = ()) -> None:
        ftype_value, only_copy = parse_ftype(ftype)
        self.reader = reader
        self.allow_requantize = allow_requantize
        self.keep_split = keep_split
        self.weights = _importance(imatrix, include_weights, exclude_weights)
        pairs = tensor_types.items() if isinstance(tensor_types, Mapping) else tensor_types
        overrides = [(re.compile(pattern), _ggml_type(t, f"tensor type of {pattern!r}"))
                     for pattern, t in pairs]
        self.opt = _Options(ftype_value, only_copy, pure, not leave_output_tensor,
                            _ggml_type(output_tensor_type, "output_tensor_type"),
                            _ggml_type(token_embedding_type, "token_embedding_type"),
                            overrides, self.weights is not None)
        self.kv_overrides = dict(kv_overrides or {})
        metadata = dict(reader.metadata)
        for key, value in self.kv_overrides.items():  # the loader reads hparams through them
            metadata[key] = value
        self.hp = _Hparams.of(metadata)
        if reader.alignment != _ALIGNMENT:
            raise QuantizeError(f"general.alignment {reader.alignment}: llama.cpp's quantizer "
                                f"lays its output out for {_ALIGNMENT} only")
        by_layer = _ordered(list(reader.tensors), False)
        self.file_type = (_guessed_ftype(by_layer, reader.metadata) if only_copy
                          else int(ftype_value))
        prune = sorted({int(i) for i in prune_layers})
        if prune and prune[0] < 0:
            raise ValueError(f"invalid layer id {prune[0]} to prune")
        self.n_blocks, renamed = _pruned(by_layer, prune)
        if keep_split:
            renamed.sort(key=lambda pair: (pair[0].part, pair[0].offset))
        self.tensors = [t for t, _ in renamed]
        names = [name for _, name in renamed]
        self.rules = _TypeRules(self.hp, self.opt, names)
        self.plans = [self._plan(t, name, cat) for t, name, cat in zip(self.tensors, names, self.rules.categories)]

    def _plan(self, t: Any, name: str, cat: _Cat) -> TensorPlan:
        shape = t.shape[:_n_dims(t.shape)] if t.shape else (1,)
        dst = self.rules.choose(name, shape, t.type, cat)
        if (self.weights is None and _requires_imatrix(t.name, dst, self.opt.ftype)
                and _allows_quantization(t.name, shape, self.hp.arch, self.opt)):
            raise QuantizeError(f"this quantization requires an importance matrix (tensor "
                                f"{t.name}, type {dst.name}); pass one with imatrix= / --imatrix")
        if dst != t.type:
            if _is_quantized(t.type) and not self.allow_requantize:
                raise QuantizeError(f"requantizing from type {t.type.name} is disabled "
                                    f"(tensor {t.name}); allow it with allow_requantize=True / "
                                    f"--allow-requantize")
            if t.type not in (_T.F32, _T.F16, _T.BF16) and not _is_quantized(t.type):
                raise QuantizeError(f"cannot dequantize/convert tensor type {t.type.name} "
                                    f"(tensor {t.name})")
        return TensorPlan(name, shape, t.type, dst, t.part if self.keep_split else 0)

    def importance_for(self, t: Any, p: TensorPlan) -> np.ndarray | None:
        """The tensor's importance weights [n_expert, n_per_row], checked like llama.cpp."""
        w = None if self.weights is None else self.weights.get(t.name)
        n_per_row = p.shape[0]
        n_expert = p.shape[2] if len(p.shape) > 2 else 1
        if w is not None and w.size != n_per_row * n_expert:
            if t.name not in ("token_embd.weight", "per_layer_token_embd.weight"):
                raise QuantizeError(f"imatrix size {w.size} is different from tensor size "
                                    f"{n_per_row * n_expert} for {t.name}")
            w = None
        if w is None and _requires_imatrix(t.name, p.dst_type, self.opt.ftype):
            raise QuantizeError(f"Missing importance matrix for tensor {t.name} in a very "
                                f"low-bit quantization")
        return None if w is None else w.reshape(n_expert, n_per_row)

    def metadata(self) -> list[tuple[str, Any, Any, Any]]:
        """(key, value, type, array type) as llama.cpp writes them: the input's in its order,
        then quantization version and file type moved to the end, split keys dropped, then
        the overrides (each replacing its key at the end)."""
        from gguflm.gguf.constants import GGUFValueType as V

        r = self.reader
        kv = {key: (value, r.value_types[key], r.array_type(key)) for key, value in r.metadata.items()}

        def put(key: str, value: Any, vtype: Any) -> None:
            kv.pop(key, None)
            kv[key] = (value, vtype, None)

        put("general.quantization_version", QUANTIZATION_VERSION, V.UINT32)
        put("general.file_type", self.file_type & 0xFFFFFFFF, V.UINT32)
        for key in ("split.no", "split.count", "split.tensors.count"):
            kv.pop(key, None)
        for key, value in self.kv_overrides.items():
            put(key, *_override_entry(key, value))
        if self.n_blocks is not None:
            put(f"{self.hp.arch}.block_count", self.n_blocks, V.UINT32)
        return [(key, *entry) for key, entry in kv.items()]


def _importance(imatrix: PathArg | Mapping[str, np.ndarray] | None, include: Sequence[str],
                exclude: Sequence[str]) -> dict[str, np.ndarray] | None:
    """Per-tensor importance weights (llama.cpp's normalized imatrix values), filtered by the
    include/exclude substrings; None when there are none."""
    if include and exclude:
        raise ValueError("include_weights and exclude_weights cannot be used together")
    if imatrix is None:
        return None
    if isinstance(imatrix, Mapping):
        weights = {name: np.ascontiguousarray(v, dtype=np.float32).reshape(-1)
                   for name, v in imatrix.items()}
    else:
        from gguflm.imatrix import read_imatrix

        weights = read_imatrix(imatrix).importance()
    if exclude:
        weights = {n: v for n, v in weights.items() if not any(x in n for x in exclude)}
    if include:
        weights = {n: v for n, v in weights.items() if any(x in n for x in include)}
    if not weights:
        return None
    for name, v in weights.items():
        if not np.isfinite(v).all():
            raise QuantizeError(f"imatrix contains non-finite values (entry {name})")
    return weights


def quantize(src: PathArg, dst: PathArg, ftype: str | int | FileType, *,
             imatrix: PathArg | Mapping[str, np.ndarray] | None = None,
             nthread: int | None = None, allow_requantize: bool = False,
             leave_output_tensor: bool = False, pure: bool = False,
             output_tensor_type: TypeArg = None, token_embedding_type: TypeArg = None,
             tensor_types: Sequence[tuple[str, TypeArg]] | Mapping[str, TypeArg] = (),
             include_weights: Sequence[str] = (), exclude_weights: Sequence[str] = (),
             kv_overrides: Mapping[str, bool | int | float | str] | None = None,
             keep_split: bool = False, prune_layers: Sequence[int] = (),
             progress: Callable[[int, int, str], None] | None = None) -> QuantizeResult:
    """Quantize the GGUF model ``src`` to ``dst`` as ``llama_model_quantize`` does.

    Parameters
    ----------
    src, dst
        Input GGUF (F32/F16/BF16, or quantized with ``allow_requantize``; the first part of a
        split model) and output path. With ``keep_split`` the output parts are named
        ``{dst without .gguf}-0000i-of-0000n.gguf``.
    ftype
        A llama-quantize type name (``"Q4_K_M"``, ``"Q8_0"``, ``"IQ2_M"``, ``"COPY"``, aliases
        such as ``"Q4_K"``), a :class:`~gguflm.ggml_types.FileType`, or its number.
    imatrix
        Importance matrix: a file of ``gguflm imatrix`` / ``llama-imatrix`` (GGUF or legacy
        ``.dat``), or a mapping of tensor name → importance weights (``llama_model_imatrix_data``:
        already divided by the counts, ``n_per_row * n_expert`` values).
    nthread
        Threads quantizing rows (None: the usable cores). The output does not depend on it.
    allow_requantize, leave_output_tensor, pure, output_tensor_type, token_embedding_type
        As llama-quantize's ``--allow-requantize``, ``--leave-output-tensor``, ``--pure``,
        ``--output-tensor-type``, ``--token-embedding-type``.
    tensor_types
        ``(regex, type)`` pairs (``--tensor-type``): the first pattern found in a tensor's
        name picks its type.
    include_weights, exclude_weights
        Use the importance matrix only for / not for tensors whose name contains one of these.
    kv_overrides
        Metadata to set (``--override-kv``): int → UINT32, float → FLOAT32, bool, str.
    keep_split
        Write the output in the input's shards.
    prune_layers
        Blocks to leave out (``--prune-layers``); the others are renumbered from 0.
    progress
        Called as ``progress(tensors_done, n_tensors, name)`` as tensors are written.

    Returns
    -------
    QuantizeResult

    Raises
    ------
    QuantizeError
        For an input llama.cpp refuses too: a quantized input without ``allow_requantize``, a
        type it cannot convert, a very low-bit type without importance data.
    """
    from gguflm.gguf import GGUFReader, GGUFWriter
    from gguflm.threads import resolve_n_threads

    start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    if dst.exists() and src.exists() and dst.resolve() == src.resolve():
        raise ValueError(f"input and output files are the same: {src}")
    n_threads = resolve_n_threads(nthread)
    with GGUFReader(src) as reader:
        job = _Job(reader, ftype, imatrix=imatrix, include_weights=include_weights,
                   exclude_weights=exclude_weights, allow_requantize=allow_requantize,
                   leave_output_tensor=leave_output_tensor, pure=pure,
                   output_tensor_type=output_tensor_type,
                   token_embedding_type=token_embedding_type, tensor_types=tensor_types,
                   kv_overrides=kv_overrides, keep_split=keep_split, prune_layers=prune_layers)
        weights = [job.importance_for(t, p) if p.dst_type != t.type else None
                   for t, p in zip(job.tensors, job.plans)]
        n_parts = max(p.part for p in job.plans) + 1 if job.plans else 1
        out_path = dst
        if keep_split:
            prefix = dst.with_suffix("") if dst.suffix == ".gguf" else dst
            out_path = prefix.with_name(prefix.name + ".gguf")
        writer = GGUFWriter(out_path)
        for key, value, vtype, atype in job.metadata():
            writer.add(key, value, vtype, atype)
        pool = ThreadPoolExecutor(n_threads) if n_threads > 1 else None
        quantizer = _Quantizer(pool, n_threads)
        done = [0]

        def producer(t: Any, p: TensorPlan, w: np.ndarray | None) -> Callable[[], np.ndarray]:
            def make() -> np.ndarray:
                data = np.asarray(t.data) if p.dst_type == t.type else quantizer.run(t, p.dst_type, w)
                done[0] += 1
                if progress is not None:
                    progress(done[0], len(job.plans), t.name)
                return data
            return make

        for t, p, w in zip(job.tensors, job.plans, weights):
            writer.add_tensor(p.name, producer(t, p, w), p.dst_type, p.shape)
        try:
            if keep_split and n_parts == 1:  # llama.cpp names even a single shard as a split
                from gguflm.gguf.constants import split_path
                writer.path = split_path(out_path.with_suffix(""), 0, 1)
                paths = writer.write()
            else:
                paths = writer.write(split_parts=[p.part for p in job.plans] if keep_split else None)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
    return QuantizeResult(paths, job.file_type, job.plans,
                          sum(p.src_bytes for p in job.plans), sum(p.dst_bytes for p in job.plans),
                          sum(p.n_elements for p in job.plans), time.perf_counter() - start,
                          job.rules.fallbacks)
