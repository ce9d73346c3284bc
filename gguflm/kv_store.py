"""How one layer's K or V rows are stored in the cache: float32, float16 or q8_0 blocks."""

from __future__ import annotations

import numpy as np

from gguflm.errors import StateError
from gguflm.ggml_types import GGMLType

# the KV cache types a context accepts, by name, and the ggml type of their rows: the one list
# (the CLI's choices, llama-cpp-python's ggml type ids, the benchmarks' peer all derive from it;
# src/plan.pyx's _CACHE_TYPE_IDS repeats the ids for the C side)
CACHE_TYPES: dict[str, GGMLType] = {"f32": GGMLType.F32, "f16": GGMLType.F16, "q8_0": GGMLType.Q8_0}


def cache_type_name(value: str | int) -> str:
    """A KV cache type by name, or by its ggml type id (llama-cpp-python's ``type_k``/``type_v``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        names = {int(t): name for name, t in CACHE_TYPES.items()}
        if value not in names:
            ids = ", ".join(f"{name} {int(t)}" for name, t in CACHE_TYPES.items())
            raise ValueError(f"unsupported KV cache ggml type id {value} ({ids})")
        return names[value]
    return value


def check_cache_type(which: str, cache_type: str, head_dim: int) -> None:
    """ValueError unless ``cache_type`` is a cache type whose blocks tile a head of ``head_dim``
    values (llama.cpp refuses a quantized cache whose blocks would straddle two heads)."""
    if cache_type not in CACHE_TYPES:
        raise ValueError(f"{which} must be one of {', '.join(CACHE_TYPES)}, got {cache_type!r}")
    block = CACHE_TYPES[cache_type].block_size
    if head_dim % block:
        raise ValueError(f"{which} {cache_type} with block size {block} does not divide the head "
                         f"size {head_dim}")


def rotation(which: str, cache_type: str, head_dim: int) -> int:
    """How many values llama.cpp rotates together with a Walsh-Hadamard matrix before storing
    ``which`` ("k" or "v") rows in a cache of ``cache_type``, 0 for none. A quantized cache holds
    rotated rows, whose outliers are spread over the block (llama.cpp's attn_rot_k/attn_rot_v):
    Q and K are rotated alike, so their dot is unchanged; V is rotated before the store and the
    attention output back after. K takes the largest power of two from 64 up dividing the head
    size, V always 64; either only when the head size is a multiple of 64."""
    if CACHE_TYPES[cache_type].block_size == 1 or head_dim % 64:
        return 0
    chunk = 64
    while which == "k" and head_dim % (2 * chunk) == 0:
        chunk *= 2
    return chunk


class RowStore:
    """[size, n] rows of one cache type; writes convert float32 rows the way ggml's copy does.
    ``rotation``: the Walsh-Hadamard chunk the rows are stored rotated by (0: none), see
    :func:`rotation`."""

    def __init__(self, cache_type: str, size: int, n: int, rotation: int = 0):
        check_cache_type("cache type", cache_type, n)
        self.cache_type = cache_type
        self.n = n
        self.rotation = rotation
        self.ggml_type = CACHE_TYPES[cache_type]
        if cache_type == "f32":
            self.data = np.zeros((size, n), np.float32)
        elif cache_type == "f16":
            self.data = np.zeros((size, n), np.float16)  # numpy converts round-to-nearest-even
        else:
            self.data = np.zeros((size, self.ggml_type.row_bytes(n)), np.uint8)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def write(self, cells: np.ndarray, x: np.ndarray) -> None:
        """Store float32 rows ``x`` ([len(cells), n]) into ``cells``."""
        if self.ggml_type is GGMLType.Q8_0:
            from gguflm._ext import quants

            q = np.empty((len(cells), self.data.shape[1]), np.uint8)
            quants.quantize_act(int(GGMLType.Q8_0), np.ascontiguousarray(x, np.float32), q)
            self.data[cells] = q
        else:
            self.data[cells] = x

    def rows(self, cells: np.ndarray) -> np.ndarray:
        return self.data[cells]

    def rows_f32(self, cells: np.ndarray) -> np.ndarray:
        """The rows of ``cells`` as float32 ([len(cells), n], contiguous): converted, or dequantized."""
        if self.ggml_type is not GGMLType.Q8_0:
            return np.ascontiguousarray(self.data[cells], dtype=np.float32)
        from gguflm._ext import quants

        out = np.empty((len(cells), self.n), np.float32)
        quants.dequantize(int(self.ggml_type), np.ascontiguousarray(self.data[cells]), out)
        return out

    def check_rows(self, rows: np.ndarray, n_rows: int) -> None:
        if rows.dtype != self.data.dtype or rows.shape != (n_rows, self.data.shape[1]):
            raise StateError(f"saved cache rows are {rows.dtype}{list(rows.shape)}, this cache "
                             f"holds {self.data.dtype}[{n_rows}, {self.data.shape[1]}]")

    def set_rows(self, cells: np.ndarray, rows: np.ndarray) -> None:
        self.data[cells] = rows

    def clear(self) -> None:
        self.data.fill(0)

