"""Control vectors (llama.cpp's ``llama_adapter_cvec``): a direction added to the hidden state
after each layer of a range, steering what the model writes.

:func:`load_control_vectors` reads ``cvector-generator``'s GGUF files (``direction.<layer>``
tensors, F32, one per layer from 1) and sums them with their strengths into one buffer laid out
as ``common_control_vector_load`` lays it (layer 1's ``n_embd`` values first: layer 0 never has
one); :meth:`gguflm.Context.set_adapter_cvec` takes that buffer, and the forward pass adds layer
``il``'s direction to the layer's output for ``il_start <= il <= il_end``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from os import PathLike
from pathlib import Path

import numpy as np

from gguflm.errors import GGUFError, ModelLoadError
from gguflm.ggml_types import GGMLType
from gguflm.gguf import GGUFReader

__all__ = ["ControlVectorError", "ControlVectors", "load_control_vectors"]


class ControlVectorError(ModelLoadError):
    """A control-vector file is malformed, or does not fit the others or the model."""


def _load_one(path: Path, strength: float) -> tuple[int, np.ndarray]:
    """One file's directions times ``strength``: (n_embd, data from layer 1 on)."""
    try:
        reader = GGUFReader(path, mode="read")
    except GGUFError as exc:
        raise ControlVectorError(f"cannot read the control vector: {exc}") from None
    n_embd, data = -1, np.zeros(0, np.float32)
    with reader:
        if not reader.tensors:
            raise ControlVectorError(f"{path.name}: no direction tensors")
        for info in reader.tensors:
            prefix, _, index = info.name.partition(".")
            layer = int(index) if prefix == "direction" and index.isdigit() else -1
            if layer < 1:
                raise ControlVectorError(f"{path.name}: tensor '{info.name}' is no direction.<layer> of a "
                                         "layer from 1 on")
            if info.type is not GGMLType.F32 or len(info.shape) != 1:
                raise ControlVectorError(f"{path.name}: '{info.name}' must be a 1-D F32 tensor, got "
                                         f"{info.type.name} {list(info.shape)}")
            if n_embd == -1:
                n_embd = info.shape[0]
            elif info.shape[0] != n_embd:
                raise ControlVectorError(f"{path.name}: '{info.name}' has {info.shape[0]} values, the "
                                         f"directions before it {n_embd}")
            if len(data) < n_embd * layer:
                data = np.concatenate([data, np.zeros(n_embd * layer - len(data), np.float32)])
            # float32 products added in file order (one file may hold a layer twice)
            data[n_embd * (layer - 1):n_embd * layer] += info.data * np.float32(strength)
    return n_embd, data


def load_control_vectors(vectors: Mapping[str | PathLike[str], float] | Iterable[tuple[str | PathLike[str], float]]
                         ) -> tuple[np.ndarray, int]:
    """Control-vector files (path → strength, or pairs) summed into one buffer, as llama.cpp's
    ``common_control_vector_load``: (data, n_embd), data float32 with layer 1's values first.

    Raises
    ------
    ControlVectorError
        A file cannot be read or holds a tensor that is no 1-D F32 ``direction.<layer>`` (layer
        from 1), or the files' widths differ.
    """
    items = list(vectors.items() if isinstance(vectors, Mapping) else vectors)
    if not items:
        raise ControlVectorError("no control vector files given")
    n_embd, total = -1, np.zeros(0, np.float32)
    for path, strength in items:
        width, data = _load_one(Path(path), float(strength))
        if n_embd != -1 and width != n_embd:
            raise ControlVectorError(f"{Path(path).name}: {width} values per layer, the files before it {n_embd}")
        n_embd = width
        if len(total) < len(data):
            total = np.concatenate([total, np.zeros(len(data) - len(total), np.float32)])
        total[:len(data)] += data
    return total, n_embd


class ControlVectors:
    """A context's control vector (llama.cpp's ``llama_adapter_cvec``): one direction per layer
    from 1, zero until set, and the layer range they are added in."""

    def __init__(self, n_layer: int, n_embd: int):
        self.n_embd = n_embd
        self._directions: np.ndarray | None = None   # [n_layer, n_embd]; row 0 unused
        self._n_layer = n_layer
        self.layer_start = self.layer_end = -1

    def apply(self, data: np.ndarray | None, n_embd: int, il_start: int, il_end: int) -> None:
        """Take ``data`` (float32, layer 1's values first; layers it does not reach keep what they
        had) for layers ``il_start`` to ``il_end``; None turns the vector off, keeping it."""
        if data is None:
            self.layer_start = self.layer_end = -1
            return
        if n_embd != self.n_embd:
            raise ValueError(f"the control vector has n_embd {n_embd}, the model {self.n_embd}")
        data = np.asarray(data, np.float32).reshape(-1)
        if self._directions is None:
            self._directions = np.zeros((self._n_layer, self.n_embd), np.float32)
        self.layer_start, self.layer_end = il_start, il_end
        for il in range(1, self._n_layer):
            off = n_embd * (il - 1)
            if off + n_embd <= len(data):
                self._directions[il] = data[off:off + n_embd]

    def direction(self, il: int) -> np.ndarray | None:
        """What is added to layer ``il``'s output ([n_embd]), or None (llama.cpp's ``tensor_for``)."""
        if self._directions is None or il < max(1, self.layer_start) or il > self.layer_end \
                or il >= self._n_layer:
            return None
        return self._directions[il]
