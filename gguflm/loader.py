"""Model loading (llama.cpp's llama_model_loader): open the file, apply metadata overrides, pick
the architecture, read hyper-parameters and vocabulary, then bind the declared tensors.

A vocab-only load stops after the vocabulary, as llama.cpp's does: it needs no architecture class,
so it works for any ``general.architecture``, and reads no ``{arch}.*`` key but ``vocab_size``.

With ``load_mode="mmap"`` tensors are zero-copy views of the mapped file: loading reads no weight
bytes. Every failure raises a :class:`~gguflm.errors.ModelLoadError` subclass and releases what
was opened.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from gguflm import quants
from gguflm.errors import GGUFError, LoadCancelled, ModelLoadError
from gguflm.ggml_types import GGMLType
from gguflm.gguf import GGUFReader, GGUFValueType, TensorInfo
from gguflm.gguf.reader import ReaderMode
from gguflm.hparams import HParamReader, HParams
from gguflm.models import Architecture, get_architecture

if TYPE_CHECKING:
    from gguflm.vocab import Vocab

log = logging.getLogger("gguflm")

# how a model's weights are held (Model.load's load_mode, the CLI's --load-mode): the reader's
# mode (None: "mmap" where the file can be mapped, else "read") and whether the pages are pinned
LoadMode = Literal["auto", "mmap", "none", "mlock", "mmap+mlock"]
_LOAD_MODES: dict[str, tuple[ReaderMode | None, bool]] = {
    "auto": (None, False), "mmap": ("mmap", False), "none": ("read", False), "mlock": ("read", True),
    "mmap+mlock": ("mmap", True)}
LOAD_MODES: tuple[str, ...] = get_args(LoadMode)
assert LOAD_MODES == tuple(_LOAD_MODES)

# weight types the kernels compute with: every format with a dot kernel
SUPPORTED_TYPES = frozenset(f.type for f in quants.formats() if f.vec_dot_type is not None)


class MissingTensorError(ModelLoadError):
    """A tensor the architecture requires is not in the file."""


class TensorShapeError(ModelLoadError):
    """A tensor's shape differs from what the hyper-parameters imply."""


class TensorCountError(ModelLoadError):
    """The file holds tensors the architecture does not declare."""


class UnsupportedTensorTypeError(ModelLoadError):
    """A tensor uses a ggml type the kernels cannot compute with."""


class InvalidTensorDataError(ModelLoadError):
    """``check_tensors=True`` found NaN or Inf in a tensor or its block scales."""


class OverrideError(ModelLoadError):
    """A ``kv_overrides`` entry does not fit the key it overrides."""


@dataclass(frozen=True)
class Weight:
    """A tensor bound to its data: ``data`` is a view of the file (mmap) or of private memory.

    For matrices ``data`` has one row per output (numpy shape ``(shape[1], row_bytes)`` for block
    types, ``(shape[1], shape[0])`` for float types). ``rows16``: ``data`` is a private copy in the
    rows-16 layout (:func:`gguflm.quants.to_rows16`; :func:`~gguflm.quants.from_rows16` gives the
    file's bytes back), as a full load holds the matmul weights of its types. ``held_as``: ``data``
    holds the weights in that type's blocks (:data:`gguflm.quants.HELD_AS`), which the kernels
    compute with (``kernel_type``); ``type`` and ``nbytes`` stay the file's.
    """

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    data: np.ndarray
    rows16: bool = False
    held_as: GGMLType | None = None

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def kernel_type(self) -> GGMLType:
        """The type of the blocks in ``data``."""
        return self.type if self.held_as is None else self.held_as

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor in the file."""
        if self.held_as is None:
            return self.data.nbytes
        return self.data.shape[0] * quants.get(self.type).row_bytes(self.shape[0])

    def as_matrix(self) -> Weight:
        """A vector as the one-row matrix a matmul takes it as (shape (n, 1))."""
        if len(self.shape) != 1:
            return self
        return Weight(self.name, self.type, (self.shape[0], 1), self.data.reshape(1, -1))


def apply_overrides(metadata: Mapping[str, Any], overrides: Mapping[str, Any] | None,
                    value_types: Mapping[str, GGUFValueType], source: str) -> dict[str, Any]:
    """Metadata with ``--override-kv``-style overrides applied: typed int, float, bool or str.

    Arrays are copied out of the file map, so that metadata outlives a closed model."""
    result = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in metadata.items()}
    for key, value in (overrides or {}).items():
        if not isinstance(value, (bool, int, float, str)):
            raise OverrideError(f"{source}: override for {key!r} must be int, float, bool or str, "
                                f"got {type(value).__name__}")
        vtype = value_types.get(key)
        if vtype is not None:
            if vtype is GGUFValueType.BOOL and not isinstance(value, bool) \
                    or vtype is GGUFValueType.STRING and not isinstance(value, str) \
                    or vtype.is_integer and (isinstance(value, (bool, str, float))) \
                    or vtype.is_float and isinstance(value, (bool, str)) \
                    or vtype is GGUFValueType.ARRAY:
                raise OverrideError(f"{source}: override for {key!r} has type "
                                    f"{type(value).__name__}, the key holds {vtype.name}")
            if vtype.is_float:
                value = float(value)
        result[key] = value
        log.info("override %s = %r", key, value)
    return result


def _mlock(arrays: list[np.ndarray], source: str) -> None:
    """Pin the pages behind ``arrays`` (best effort, as llama.cpp: a failure is a warning)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    for arr in arrays:
        if arr.nbytes and libc.mlock(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(arr.nbytes)) != 0:
            log.warning("%s: failed to mlock %d bytes (errno %d); raise RLIMIT_MEMLOCK to pin the "
                        "model", source, arr.nbytes, ctypes.get_errno())
            return


def _scale_fields(t: GGMLType) -> list[int]:
    """Byte offsets of the fp16 scale fields inside one block of ``t`` (for check_tensors)."""
    return {
        GGMLType.Q4_0: [0], GGMLType.Q4_1: [0, 2], GGMLType.Q5_0: [0], GGMLType.Q5_1: [0, 2],
        GGMLType.Q8_0: [0], GGMLType.Q2_K: [80, 82], GGMLType.Q3_K: [108], GGMLType.Q4_K: [0, 2],
        GGMLType.Q5_K: [0, 2], GGMLType.Q6_K: [208],
        GGMLType.IQ2_XXS: [0], GGMLType.IQ2_XS: [0], GGMLType.IQ2_S: [0], GGMLType.IQ3_XXS: [0],
        GGMLType.IQ3_S: [0], GGMLType.IQ1_S: [0],
        GGMLType.IQ4_NL: [0], GGMLType.IQ4_XS: [0], GGMLType.TQ1_0: [52], GGMLType.TQ2_0: [64],
    }.get(t, [])


def _iq1_m_scales(blocks: np.ndarray) -> np.ndarray:
    """IQ1_M's fp16 super-block scales, spread over the top nibbles of the four scale words."""
    sc = blocks[:, 48:56].copy().view(np.uint16)
    bits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
    return bits.astype(np.uint16).view(np.float16)


def check_tensor_data(w: Weight, source: str) -> None:
    """NaN/Inf in a float tensor or in the scales of a quantized one → InvalidTensorDataError."""
    if w.type in (GGMLType.F32, GGMLType.F16):
        bad = not np.isfinite(w.data).all()
    elif w.type is GGMLType.BF16:
        bad = not np.isfinite((w.data.astype(np.uint32) << 16).view(np.float32)).all()
    else:
        blocks = w.data.reshape(-1, w.type.type_size)
        bad = any(not np.isfinite(blocks[:, off:off + 2].copy().view(np.float16)).all()
                  for off in _scale_fields(w.type))
        if w.type is GGMLType.IQ1_M:
            bad = not np.isfinite(_iq1_m_scales(blocks)).all()
    if bad:
        raise InvalidTensorDataError(f"{source}: tensor '{w.name}' has NaN or Inf values")


@dataclass(frozen=True)
class LoadedNetwork:
    """What a full load adds to the vocabulary: everything the forward pass needs."""

    arch: type[Architecture]
    hparams: HParams
    weights: dict[str, Weight]


@dataclass
class LoadedModel:
    """What :func:`load` hands to :class:`gguflm.model.Model`."""

    path: Path
    reader: GGUFReader
    metadata: dict[str, Any]
    arch_name: str                  # general.architecture
    n_vocab: int
    vocab: Vocab
    network: LoadedNetwork | None   # None: loaded with vocab_only
    load_mode: str


def _open_reader(path: Path, load_mode: str) -> GGUFReader:
    mode = _LOAD_MODES[load_mode][0]
    if mode is None:
        try:
            return GGUFReader(path, mode="mmap")
        except GGUFError:
            raise
        except (OSError, ValueError) as exc:  # mmap refused: read instead
            log.info("%s: mmap failed (%s), reading into memory", path, exc)
            return GGUFReader(path, mode="read")
    return GGUFReader(path, mode=mode)


def load(path: str | PathLike[str], *, load_mode: LoadMode = "auto", vocab_only: bool = False,
         progress_callback: Callable[[float], bool] | None = None,
         kv_overrides: Mapping[str, Any] | None = None, check_tensors: bool = False) -> LoadedModel:
    """Open ``path`` and bind what the model needs (see :meth:`gguflm.Model.load`)."""
    if load_mode not in LOAD_MODES:
        raise ValueError(f"load_mode must be one of {LOAD_MODES}, got {load_mode!r}")
    path = Path(path)
    source = path.name
    try:
        reader = _open_reader(path, load_mode)
    except GGUFError as exc:
        raise ModelLoadError(str(exc)) from exc
    try:
        return _load_from_reader(reader, path, source, load_mode, vocab_only, progress_callback,
                                 kv_overrides, check_tensors)
    except BaseException:
        reader.close()
        raise


def _load_from_reader(reader: GGUFReader, path: Path, source: str, load_mode: str, vocab_only: bool,
                      progress_callback: Callable[[float], bool] | None,
                      kv_overrides: Mapping[str, Any] | None, check_tensors: bool) -> LoadedModel:
    from gguflm.vocab import Vocab

    metadata = apply_overrides(reader.metadata, kv_overrides, reader.value_types, source)
    arch_name = metadata.get("general.architecture")
    if not isinstance(arch_name, str):
        raise ModelLoadError(f"{source}: key not found in model: general.architecture")
    # only the forward pass needs an architecture class; a full load looks it up before the
    # vocabulary, as llama.cpp does
    arch = None if vocab_only else get_architecture(arch_name)
    vocab = Vocab.from_metadata(metadata)
    kv = HParamReader(arch_name, metadata, source)
    n_vocab = kv.get_int("{arch}.vocab_size", vocab.n_tokens)
    if arch is None:
        log.info("%s: arch %s, vocab %d; vocab only - skipping hyper-parameters and tensors",
                 source, arch_name, n_vocab)
        return LoadedModel(path, reader, metadata, arch_name, n_vocab, vocab, None, load_mode)
    hparams = arch.read_hparams(kv, n_vocab)
    log.info("%s: arch %s, %d layers, n_embd %d, vocab %d", source, arch_name, hparams.n_layer,
             hparams.n_embd, hparams.n_vocab)
    weights = _bind_tensors(reader, arch, hparams, source, progress_callback, check_tensors)
    _hold_for_kernels(weights, reader)
    if _LOAD_MODES[load_mode][1]:
        _mlock([w.data for w in weights.values()], source)
    return LoadedModel(path, reader, metadata, arch_name, n_vocab, vocab,
                       LoadedNetwork(arch, hparams, weights), load_mode)


# the tensors llama.cpp reads with get_rows (LLM_TENSOR_INFOS: GGML_OP_GET_ROWS), never repacked
ROW_LOOKUP_TENSORS = frozenset({"token_embd.weight", "position_embd.weight", "token_types.weight"})


def _hold_for_kernels(weights: dict[str, Weight], reader: GGUFReader) -> None:
    """Convert the matmul weights that the kernels read faster in another form (a private copy
    each) and give the file's pages under them back; a Weight two names share (a tied output
    projection is its token embedding's) is converted once."""
    as_types = held_types(weights)
    held: dict[int, Weight] = {}
    for name, w in weights.items():
        if id(w) not in held:
            held[id(w)] = _held(w, as_types.get(id(w)))
            if held[id(w)] is not w:
                reader.release(w.data)
        weights[name] = held[id(w)]


def _held(w: Weight, as_type: GGMLType | None) -> Weight:
    """``w`` as a full load holds it: in ``as_type``'s blocks (:func:`held_types`), the rows-16
    layout for the 2-D matmul weights of :data:`gguflm.quants.ROWS16_TYPES` with whole groups of
    16 rows (llama.cpp repacks the same ones into its CPU_REPACK buffer at load), else as the file
    has it. Tensors read by rows (get_rows) never take the rows-16 layout, a tied output neither."""
    if as_type is not None:
        return replace(w, data=quants.hold_as(w.data, w.type, n_threads=None), held_as=as_type)
    if w.name not in ROW_LOOKUP_TENSORS and w.type in quants.ROWS16_TYPES and len(w.shape) == 2 \
            and w.shape[1] % quants.ROWS16 == 0:
        return replace(w, data=quants.to_rows16(w.data, w.type, n_threads=None), rows16=True)
    return w


def held_types(weights: Mapping[str, Weight]) -> dict[int, GGMLType]:
    """The Weights (by ``id``) a full load holds in another type's blocks, and that type
    (:data:`gguflm.quants.HELD_AS`): the matrices of those types that a matmul reads. The values
    stay the same, so rows read from them are too; a token embedding only read by rows is left
    as it is (the larger blocks would cost memory for nothing), one the output shares is held."""
    by_matmul = {id(w) for name, w in weights.items() if name not in ROW_LOOKUP_TENSORS}
    return {id(w): quants.HELD_AS[w.type] for w in weights.values()
            if id(w) in by_matmul and len(w.shape) >= 2 and w.type in quants.HELD_AS}


def _ggml_dims(shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` without its trailing 1s: ggml's writers (llama-quantize) drop them, so a [512, 1]
    tensor is [512] in a quantized file, and llama.cpp's loader takes either."""
    dims = tuple(shape)
    while len(dims) > 1 and dims[-1] == 1:
        dims = dims[:-1]
    return dims


def _bind_tensors(reader: GGUFReader, arch: type[Architecture], hparams: HParams, source: str,
                  progress_callback: Callable[[float], bool] | None,
                  check_tensors: bool) -> dict[str, Weight]:
    specs = arch.tensor_specs(hparams)
    total = sum(t.nbytes for t in reader.tensors) or 1
    done = 0

    def progress(fraction: float) -> None:
        if progress_callback is not None and not progress_callback(fraction):
            raise LoadCancelled(f"{source}: loading cancelled by the progress callback")

    progress(0.0)
    weights: dict[str, Weight] = {}
    used: set[str] = set()
    for spec in specs:
        info: TensorInfo | None = reader.tensor(spec.name) if spec.in_file and spec.name in reader else None
        if info is None:
            if spec.fallback is not None and spec.fallback in weights:
                weights[spec.name] = weights[spec.fallback]
                continue
            if spec.optional:
                continue
            raise MissingTensorError(f"{source}: missing tensor '{spec.name}'")
        if _ggml_dims(info.shape) not in [_ggml_dims(s) for s in (spec.shape, *spec.alt_shapes)]:
            raise TensorShapeError(f"{source}: tensor '{spec.name}' has wrong shape; expected "
                                   f"{list(spec.shape)}, got {list(info.shape)}")
        if info.type not in SUPPORTED_TYPES:
            raise UnsupportedTensorTypeError(f"{source}: tensor '{spec.name}' has type "
                                             f"{info.type.name}, which gguflm cannot compute with")
        data = info.data
        if len(info.shape) >= 2:
            data = data.reshape(int(np.prod(info.shape[1:])), -1)
        weight = Weight(info.name, info.type, tuple(info.shape), data)
        if check_tensors:
            check_tensor_data(weight, source)
        weights[spec.name] = weight
        used.add(spec.name)
        done += info.nbytes
        progress(done / total)
    for name in arch.required_together(hparams, used):
        if name not in weights:
            raise MissingTensorError(f"{source}: missing tensor '{name}'")
    # the NextN blocks' tensors (hparams.drop_nextn_layers): in the file, never read (TENSOR_SKIP)
    nextn = {f"blk.{il}." for il in range(hparams.n_layer, hparams.n_layer + hparams.n_layer_nextn)}
    used |= {t.name for t in reader.tensors if t.name[:t.name.find(".", 4) + 1] in nextn}
    if len(used) != len(reader.tensors):
        extra = sorted(t.name for t in reader.tensors if t.name not in used)
        raise TensorCountError(f"{source}: wrong number of tensors; expected {len(used)}, got "
                               f"{len(reader.tensors)} (not used: {', '.join(extra[:5])}"
                               f"{', ...' if len(extra) > 5 else ''})")
    progress(1.0)
    return weights
