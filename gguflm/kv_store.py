"""How one layer's K or V rows are stored in the cache: float32, float16 or q8_0 blocks."""

from __future__ import annotations

import numpy as np

from gguflm.errors import StateError
from gguflm.ggml_types import GGMLType

# the KV cache types a context accepts, by name, and the ggml type of their rows
CACHE_TYPES: dict[str, GGMLType] = {"f32": GGMLType.F32, "f16": GGMLType.F16, "q8_0": GGMLType.Q8_0}


def check_cache_type(which: str, cache_type: str, head_dim: int) -> None:
    """ValueError unless ``cache_type`` is a cache type whose blocks tile a head of ``head_dim``
    values (llama.cpp refuses a quantized cache whose blocks would straddle two heads)."""
    if cache_type not in CACHE_TYPES:
        raise ValueError(f"{which} must be one of {', '.join(CACHE_TYPES)}, got {cache_type!r}")
    block = CACHE_TYPES[cache_type].block_size
    if head_dim % block:
        raise ValueError(f"{which} {cache_type} with block size {block} does not divide the head "
                         f"size {head_dim}")


class RowStore:
    """[size, n] rows of one cache type; writes convert float32 rows the way ggml's copy does."""

    def __init__(self, cache_type: str, size: int, n: int):
        check_cache_type("cache type", cache_type, n)
        self.cache_type = cache_type
        self.n = n
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

    def check_rows(self, rows: np.ndarray, n_rows: int) -> None:
        if rows.dtype != self.data.dtype or rows.shape != (n_rows, self.data.shape[1]):
            raise StateError(f"saved cache rows are {rows.dtype}{list(rows.shape)}, this cache "
                             f"holds {self.data.dtype}[{n_rows}, {self.data.shape[1]}]")

    def set_rows(self, cells: np.ndarray, rows: np.ndarray) -> None:
        self.data[cells] = rows

    def clear(self) -> None:
        self.data.fill(0)

