"""ggml's tensor types and llama.cpp's file types: ids, block sizes, bytes per block, names.

The values are ggml's (``enum ggml_type``) and llama.cpp's (``enum llama_ftype``), as stored in GGUF.
A type being listed here means the container can hold it; which types the kernels compute with is
:mod:`gguflm.quants`' business.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import IntEnum


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39

    @property
    def block_size(self) -> int:
        """Elements per block (1 for plain scalar types)."""
        return _SIZES[self][0]

    @property
    def type_size(self) -> int:
        """Bytes per block."""
        return _SIZES[self][1]

    def row_bytes(self, n_elements: int) -> int:
        """Bytes of ``n_elements`` values; ``n_elements`` must be a whole number of blocks."""
        blocks, rest = divmod(n_elements, self.block_size)
        if rest:
            raise ValueError(
                f"{self.name} row of {n_elements} elements is not a multiple of its block size "
                f"{self.block_size}"
            )
        return blocks * self.type_size


# (elements per block, bytes per block), as ggml's type_traits
_SIZES: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20),
    GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q8_1: (32, 36),
    GGMLType.Q2_K: (256, 84),
    GGMLType.Q3_K: (256, 110),
    GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210),
    GGMLType.Q8_K: (256, 292),
    GGMLType.IQ2_XXS: (256, 66),
    GGMLType.IQ2_XS: (256, 74),
    GGMLType.IQ3_XXS: (256, 98),
    GGMLType.IQ1_S: (256, 50),
    GGMLType.IQ4_NL: (32, 18),
    GGMLType.IQ3_S: (256, 110),
    GGMLType.IQ2_S: (256, 82),
    GGMLType.IQ4_XS: (256, 136),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (256, 56),
    GGMLType.BF16: (1, 2),
    GGMLType.TQ1_0: (256, 54),
    GGMLType.TQ2_0: (256, 66),
    GGMLType.MXFP4: (32, 17),
}


class FileType(IntEnum):
    """``general.file_type``: what llama.cpp's quantizer was asked for (``enum llama_ftype``)."""

    ALL_F32 = 0
    MOSTLY_F16 = 1
    MOSTLY_Q4_0 = 2
    MOSTLY_Q4_1 = 3
    MOSTLY_Q8_0 = 7
    MOSTLY_Q5_0 = 8
    MOSTLY_Q5_1 = 9
    MOSTLY_Q2_K = 10
    MOSTLY_Q3_K_S = 11
    MOSTLY_Q3_K_M = 12
    MOSTLY_Q3_K_L = 13
    MOSTLY_Q4_K_S = 14
    MOSTLY_Q4_K_M = 15
    MOSTLY_Q5_K_S = 16
    MOSTLY_Q5_K_M = 17
    MOSTLY_Q6_K = 18
    MOSTLY_IQ2_XXS = 19
    MOSTLY_IQ2_XS = 20
    MOSTLY_Q2_K_S = 21
    MOSTLY_IQ3_XS = 22
    MOSTLY_IQ3_XXS = 23
    MOSTLY_IQ1_S = 24
    MOSTLY_IQ4_NL = 25
    MOSTLY_IQ3_S = 26
    MOSTLY_IQ3_M = 27
    MOSTLY_IQ2_S = 28
    MOSTLY_IQ2_M = 29
    MOSTLY_IQ4_XS = 30
    MOSTLY_IQ1_M = 31
    MOSTLY_BF16 = 32
    MOSTLY_TQ1_0 = 36
    MOSTLY_TQ2_0 = 37
    MOSTLY_MXFP4_MOE = 38

    @property
    def display_name(self) -> str:
        """The name llama.cpp prints (``llama_model_ftype_name``), e.g. ``"Q4_K - Medium"``."""
        return _FILE_TYPE_NAMES[self]


_FILE_TYPE_NAMES: dict[FileType, str] = {
    FileType.ALL_F32: "all F32",
    FileType.MOSTLY_F16: "F16",
    FileType.MOSTLY_BF16: "BF16",
    FileType.MOSTLY_Q4_0: "Q4_0",
    FileType.MOSTLY_Q4_1: "Q4_1",
    FileType.MOSTLY_Q5_0: "Q5_0",
    FileType.MOSTLY_Q5_1: "Q5_1",
    FileType.MOSTLY_Q8_0: "Q8_0",
    FileType.MOSTLY_Q2_K: "Q2_K - Medium",
    FileType.MOSTLY_Q2_K_S: "Q2_K - Small",
    FileType.MOSTLY_Q3_K_S: "Q3_K - Small",
    FileType.MOSTLY_Q3_K_M: "Q3_K - Medium",
    FileType.MOSTLY_Q3_K_L: "Q3_K - Large",
    FileType.MOSTLY_Q4_K_S: "Q4_K - Small",
    FileType.MOSTLY_Q4_K_M: "Q4_K - Medium",
    FileType.MOSTLY_Q5_K_S: "Q5_K - Small",
    FileType.MOSTLY_Q5_K_M: "Q5_K - Medium",
    FileType.MOSTLY_Q6_K: "Q6_K",
    FileType.MOSTLY_IQ2_XXS: "IQ2_XXS - 2.0625 bpw",
    FileType.MOSTLY_IQ2_XS: "IQ2_XS - 2.3125 bpw",
    FileType.MOSTLY_IQ2_S: "IQ2_S - 2.5 bpw",
    FileType.MOSTLY_IQ2_M: "IQ2_M - 2.7 bpw",
    FileType.MOSTLY_IQ3_XS: "IQ3_XS - 3.3 bpw",
    FileType.MOSTLY_IQ3_XXS: "IQ3_XXS - 3.0625 bpw",
    FileType.MOSTLY_IQ1_S: "IQ1_S - 1.5625 bpw",
    FileType.MOSTLY_IQ1_M: "IQ1_M - 1.75 bpw",
    FileType.MOSTLY_IQ4_NL: "IQ4_NL - 4.5 bpw",
    FileType.MOSTLY_IQ4_XS: "IQ4_XS - 4.25 bpw",
    FileType.MOSTLY_IQ3_S: "IQ3_S - 3.4375 bpw",
    FileType.MOSTLY_IQ3_M: "IQ3_S mix - 3.66 bpw",
    FileType.MOSTLY_TQ1_0: "TQ1_0 - 1.69 bpw ternary",
    FileType.MOSTLY_TQ2_0: "TQ2_0 - 2.06 bpw ternary",
    FileType.MOSTLY_MXFP4_MOE: "MXFP4 MoE",
}

FILE_TYPE_GUESSED = 1024  # llama.cpp's LLAMA_FTYPE_GUESSED: a file type inferred from the tensors, not stored

# the file type llama_model_loader guesses from a tensor type; a type it has none for (MXFP4 among
# them) guesses ALL_F32, as llama.cpp's does
_GUESSED_FILE_TYPES: dict[GGMLType, FileType] = {
    GGMLType.F32: FileType.ALL_F32, GGMLType.F16: FileType.MOSTLY_F16, GGMLType.BF16: FileType.MOSTLY_BF16,
    GGMLType.Q4_0: FileType.MOSTLY_Q4_0, GGMLType.Q4_1: FileType.MOSTLY_Q4_1, GGMLType.Q5_0: FileType.MOSTLY_Q5_0,
    GGMLType.Q5_1: FileType.MOSTLY_Q5_1, GGMLType.Q8_0: FileType.MOSTLY_Q8_0, GGMLType.Q2_K: FileType.MOSTLY_Q2_K,
    GGMLType.Q3_K: FileType.MOSTLY_Q3_K_M, GGMLType.Q4_K: FileType.MOSTLY_Q4_K_M,
    GGMLType.Q5_K: FileType.MOSTLY_Q5_K_M, GGMLType.Q6_K: FileType.MOSTLY_Q6_K,
    GGMLType.TQ1_0: FileType.MOSTLY_TQ1_0, GGMLType.TQ2_0: FileType.MOSTLY_TQ2_0,
    GGMLType.IQ2_XXS: FileType.MOSTLY_IQ2_XXS, GGMLType.IQ2_XS: FileType.MOSTLY_IQ2_XS,
    GGMLType.IQ2_S: FileType.MOSTLY_IQ2_S, GGMLType.IQ3_XXS: FileType.MOSTLY_IQ3_XXS,
    GGMLType.IQ1_S: FileType.MOSTLY_IQ1_S, GGMLType.IQ1_M: FileType.MOSTLY_IQ1_M,
    GGMLType.IQ4_NL: FileType.MOSTLY_IQ4_NL, GGMLType.IQ4_XS: FileType.MOSTLY_IQ4_XS,
    GGMLType.IQ3_S: FileType.MOSTLY_IQ3_S,
}

# the block number in a tensor name, as llama.cpp reads it (sscanf "blk.%d.")
BLOCK_NUMBER = re.compile(r"blk\.\s*([+-]?\d+)")


def weights_map_key(name: str) -> tuple[int, bytes]:
    """llama_model_loader's order of a file's tensors (its weights map): by block number (tensors
    of no block first), then by the name's bytes."""
    match = BLOCK_NUMBER.match(name)
    return int(match[1]) if match else -1, name.encode("utf-8", "surrogateescape")


def guess_file_type(tensors: Iterable[tuple[str, GGMLType]]) -> FileType:
    """The file type llama_model_loader guesses for a file without ``general.file_type`` from its
    tensors (name, type): that of the type most tensors have, the first to reach that count in
    the weights map's order winning a tie (a bare type, without :data:`FILE_TYPE_GUESSED`)."""
    counts: dict[GGMLType, int] = {}
    best, best_n = GGMLType.F32, 0
    for _, t in sorted(tensors, key=lambda nt: weights_map_key(nt[0])):
        counts[t] = counts.get(t, 0) + 1
        if counts[t] > best_n:
            best, best_n = t, counts[t]
    return _GUESSED_FILE_TYPES.get(best, FileType.ALL_F32)
