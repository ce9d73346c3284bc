"""LoRA adapters (llama.cpp's ``llama_adapter_lora``): low-rank corrections of a model's matrices,
read from the GGUF files ``convert_lora_to_gguf.py`` writes.

An adapter holds, per adapted matrix W (ggml ne [n_in, n_out]), ``lora_a`` (ne [n_in, rank]) and
``lora_b`` (ne [rank, n_out]); a context with the adapter set at scale s computes
``W·x + s·(alpha/rank)·B·(A·x)`` where it computes ``W·x`` (:class:`gguflm.graph.Graph`), each
product rounded as ggml-cpu rounds a matmul of that weight type (llama.cpp's ``build_lora_mm``).
The token embedding's pair is flipped (``lora_a`` ne [rank, n_vocab], rows looked up by token;
``lora_b`` ne [rank, n_embd]), as ``build_inp_embd`` reads it.

An adapter is loaded once per model (:meth:`LoraAdapter.load`, ``llama_adapter_lora_init``) and
any number of its contexts may use it (:meth:`gguflm.Context.set_adapters_lora`).
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from gguflm.errors import GGUFError, ModelLoadError
from gguflm.gguf import GGUFReader, GGUFValueType
from gguflm.loader import SUPPORTED_TYPES, Weight
from gguflm.model import Model, _meta_str

__all__ = ["LoraAdapter", "LoraAdapterError", "LoraPair"]

TOKEN_EMBD = "token_embd.weight"


class LoraAdapterError(ModelLoadError):
    """A LoRA adapter file is malformed or does not fit the base model."""


@dataclass(frozen=True)
class LoraPair:
    """The A and B matrices of one adapted weight (data: one row per output, as Weight's)."""

    a: Weight
    b: Weight

    @property
    def rank(self) -> int:
        return self.b.shape[0]

    @property
    def nbytes(self) -> int:
        return self.a.data.nbytes + self.b.data.nbytes

    def scale(self, alpha: float, adapter_scale: float) -> float:
        """The factor on B·(A·x): llama_adapter_lora_weight::get_scale, in float32."""
        s, a = np.float32(adapter_scale), np.float32(alpha)
        return float(s * a / np.float32(self.rank)) if alpha else float(s)


class LoraAdapter:
    """A LoRA adapter loaded for one model (see the module notes).

    Attributes
    ----------
    path : Path
    model : Model
        The base model it was checked against; contexts of that model may use it.
    alpha : float
        ``adapter.lora.alpha`` (0 when absent: the scale is then the adapter's scale alone).
    pairs : dict[str, LoraPair]
        Adapted tensor name → its A and B.
    meta : dict[str, str]
        Every scalar metadata value as a string (``llama_adapter_meta_val_str``).
    alora_invocation_tokens : list[int]
        An activated LoRA's invocation sequence (``adapter.alora.invocation_tokens``), else empty.
    """

    def __init__(self, path: Path, model: Model, alpha: float, pairs: dict[str, LoraPair],
                 meta: dict[str, str], alora_invocation_tokens: list[int]):
        self.path = path
        self.model = model
        self.alpha = alpha
        self.pairs = pairs
        self.meta = meta
        self.alora_invocation_tokens = alora_invocation_tokens

    @property
    def nbytes(self) -> int:
        """Bytes of the adapter's matrices (what it adds to a model's memory)."""
        return sum(p.nbytes for p in self.pairs.values())

    def __repr__(self) -> str:
        return f"LoraAdapter({self.path.name!r}, {len(self.pairs)} matrices, alpha={self.alpha:g})"

    @classmethod
    def load(cls, model: Model, path: str | PathLike[str]) -> LoraAdapter:
        """Read a LoRA adapter and check it against ``model`` (llama.cpp's ``llama_adapter_lora_init``).

        Raises
        ------
        LoraAdapterError
            The file cannot be read (missing, truncated, malformed), is not a LoRA adapter, was
            made for another architecture, or holds a tensor the model lacks, of another shape,
            of a type the kernels cannot compute with, or one half of a pair only.
        """
        path = Path(path)
        try:
            reader = GGUFReader(path, mode="read")
        except GGUFError as exc:
            raise LoraAdapterError(f"cannot read the LoRA adapter: {exc}") from None
        with reader:
            return cls(path, model, *_read(reader, model, path.name))


def _read(reader: GGUFReader, model: Model,
          source: str) -> tuple[float, dict[str, LoraPair], dict[str, str], list[int]]:
    def fail(message: str) -> LoraAdapterError:
        return LoraAdapterError(f"{source}: {message}")

    def text(key: str) -> str:
        value = reader.get(key, "")
        return value if isinstance(value, str) else ""

    if text("general.type") != "adapter":
        raise fail(f"general.type must be 'adapter', got {text('general.type')!r}")
    if text("general.architecture") != model.arch:
        raise fail(f"made for architecture {text('general.architecture')!r}, the model is {model.arch!r}")
    if text("adapter.type") != "lora":
        raise fail(f"adapter.type must be 'lora', got {text('adapter.type')!r}")
    try:
        alpha = reader.get_float("adapter.lora.alpha", 0.0)
    except GGUFError as exc:
        raise fail(str(exc)) from None
    invocation: list[int] = []
    key = "adapter.alora.invocation_tokens"
    if key in reader.metadata:
        if reader.value_types[key] is not GGUFValueType.ARRAY or reader.array_type(key) is not GGUFValueType.UINT32:
            raise fail(f"{key} must be an array of UINT32")
        invocation = [int(t) for t in reader.metadata[key]]

    halves: dict[str, dict[str, Weight]] = {}
    for info in reader.tensors:
        base, dot, half = info.name.rpartition(".")
        if dot and half in ("lora_a", "lora_b"):
            if info.type not in SUPPORTED_TYPES:
                raise fail(f"tensor '{info.name}' has type {info.type.name}, which gguflm cannot compute with")
            data = np.array(info.data)   # a private copy: the file is closed after loading
            if len(info.shape) >= 2:
                data = data.reshape(int(np.prod(info.shape[1:])), -1)
            halves.setdefault(base, {})[half] = Weight(info.name, info.type, tuple(info.shape), data)
        elif info.name.endswith("_norm.weight"):
            continue   # llama.cpp skips the norms mergekit adds
        else:
            raise fail(f"tensor '{info.name}' has an unexpected suffix (not .lora_a or .lora_b)")

    tied = model.tensors.get("output.weight") is model.tensors.get(TOKEN_EMBD)
    pairs: dict[str, LoraPair] = {}
    for name, half in halves.items():
        if len(half) != 2:
            raise fail(f"the LoRA pair of '{name}' lacks its {'lora_b' if 'lora_a' in half else 'lora_a'}")
        a, b = half["lora_a"], half["lora_b"]
        w = model.tensors.get(name)
        if w is None or w.name != name:   # a tied output.weight is the token embedding's tensor
            raise fail(f"tensor '{name}' is not in the base model (is this the adapter's base model?)")
        if len(w.shape) != 2 or len(a.shape) != 2 or len(b.shape) != 2:
            raise fail(f"tensor '{name}': gguflm applies LoRA to matrices only (expert tensors are not supported)")
        if name == TOKEN_EMBD:
            # flipped, as build_inp_embd reads it
            if w.shape[0] != b.shape[1] or w.shape[1] != a.shape[1] or a.shape[0] != b.shape[0]:
                raise _shape_error(fail, name, w, a, b)
            if tied:
                raise fail(f"'{name}' is also this model's output projection: llama.cpp cannot apply an "
                           "embedding LoRA to a model with a tied output")
        else:
            if w.shape[0] != a.shape[0] or w.shape[1] != b.shape[1]:
                raise _shape_error(fail, name, w, a, b)
            if a.shape[1] != b.shape[0]:
                raise fail(f"'{name}.lora_a' is not transposed: its rank {a.shape[1]} is not lora_b's "
                           f"{b.shape[0]}")
        pairs[name] = LoraPair(a, b)
    meta = {k: _meta_str(v) for k, v in reader.metadata.items() if _meta_str(v) is not None}
    return alpha, pairs, meta, invocation


def _shape_error(fail: Any, name: str, w: Weight, a: Weight, b: Weight) -> LoraAdapterError:
    return fail(f"tensor '{name}' has the wrong shape for the base model (lora_a {list(a.shape)}, lora_b "
                f"{list(b.shape)}; the model's is {list(w.shape)}): is this the adapter's base model?")
