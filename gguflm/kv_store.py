"""How one layer's K or V rows are stored in the cache: float32, float16 or q8_0 blocks."""

from __future__ import annotations

import numpy as np

from gguflm.errors import StateError
from gguflm.ggml_types import GGMLType


class RowStore:
    """[size, n] rows of one cache type; writes convert float32 rows the way ggml's copy does."""

    def __init__(self, cache_type: str, size: int, n: int):
        self.cache_type = cache_type
        self.n = n
        if cache_type == "f32":
            self.ggml_type = GGMLType.F32
            self.data = np.zeros((size, n), np.float32)
        elif cache_type == "f16":
            self.ggml_type = GGMLType.F16
            self.data = np.zeros((size, n), np.float16)  # numpy converts round-to-nearest-even
        elif cache_type == "q8_0":
            if n % 32:
                raise ValueError(f"q8_0 cache rows need a multiple of 32 values, got {n}")
            self.ggml_type = GGMLType.Q8_0
            self.data = np.zeros((size, GGMLType.Q8_0.row_bytes(n)), np.uint8)
        else:
            raise ValueError(f"cache type must be one of f32, f16, q8_0; got {cache_type!r}")

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

