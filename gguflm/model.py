"""The model: architecture, hyper-parameters, vocabulary and weights of one GGUF file.

A model holds no per-session state; any number of :class:`gguflm.Context` objects may share it.
A vocab-only model (any architecture) has the vocabulary and metadata but no forward pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gguflm.errors import VocabOnlyError
from gguflm.ggml_types import FileType, guess_file_type
from gguflm.gguf import GGUFReader
from gguflm.hparams import HParams
from gguflm.loader import LoadedModel, LoadMode, Weight, load
from gguflm.models import Architecture, TensorSpec

if TYPE_CHECKING:
    from gguflm.vocab import Vocab

log = logging.getLogger("gguflm")

class Layer:
    """The weights of one transformer block: an attribute for every tensor the architecture
    declares for the model's blocks (``layer.attn_q`` is ``blk.N.attn_q.weight``,
    ``layer.attn_q_bias`` its bias), None where this block has none (optional and absent, or
    declared for other blocks only); any other name raises AttributeError."""

    def __init__(self, index: int, weights: Mapping[str, Weight], fields: Mapping[str, str]):
        self.index = index
        self._fields = tuple(fields)
        for field, name in fields.items():
            setattr(self, field, weights.get(f"blk.{index}.{name}"))

    def __getattr__(self, name: str) -> Any:
        # only reached for names that are no declared tensor of the blocks
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"block {self.index} has no tensor {name!r}; the architecture declares "
                             f"{', '.join(self._fields)}")


def block_fields(specs: Iterable[TensorSpec]) -> dict[str, str]:
    """The Layer attribute of every block tensor ``specs`` declare (``attn_q`` for
    ``blk.N.attn_q.weight``, ``attn_q_bias`` for ``blk.N.attn_q.bias``) → its name within the block."""
    fields: dict[str, str] = {}
    for spec in specs:
        if spec.name.startswith("blk."):
            name = spec.name.split(".", 2)[2]
            base, _, kind = name.rpartition(".")
            # a name without a suffix (Mamba's ssm_a, ssm_d) is its own field
            field = spec.field or (name if not base else base if kind == "weight" else f"{base}_{kind}")
            fields.setdefault(field, name)
    return fields


class Model:
    """A loaded GGUF model. Create with :meth:`Model.load`; release with :meth:`close`.

    Attributes
    ----------
    arch : str
        ``general.architecture``.
    n_vocab : int
        ``{arch}.vocab_size``, else the number of tokens (``hparams.n_vocab`` of a full load).
    vocab : gguflm.vocab.Vocab
    vocab_only : bool
        Loaded with ``vocab_only=True``: no architecture, hyper-parameters or tensors.
    tensors : dict[str, Weight]
        Bound tensors by GGUF name (a tied ``output.weight`` is the embedding's Weight); empty
        for a vocab-only model.
    layers : list[Layer]
    meta : dict[str, str]
        Every scalar metadata value as a string (llama.cpp's ``llama_model_meta_val_str``).
    """

    def __init__(self, loaded: LoadedModel):
        self._reader: GGUFReader | None = loaded.reader
        self._gguf_version: int = loaded.reader.version  # describe() after close() needs it
        self.path: Path = loaded.path
        self.arch: str = loaded.arch_name
        self.n_vocab: int = loaded.n_vocab
        self.vocab: Vocab = loaded.vocab
        self.metadata: dict[str, Any] = loaded.metadata
        self.load_mode: str = loaded.load_mode
        net = loaded.network
        self.vocab_only: bool = net is None
        self._architecture: Architecture | None = None if net is None else net.arch()
        self._hparams: HParams | None = None if net is None else net.hparams
        self.tensors: dict[str, Weight] = {} if net is None else net.weights
        fields = {} if net is None else block_fields(net.arch.tensor_specs(net.hparams))
        self.layers = [] if net is None else [Layer(il, self.tensors, fields) for il in range(net.hparams.n_layer)]
        self.meta = {k: _meta_str(v) for k, v in self.metadata.items() if _meta_str(v) is not None}
        # llama_model_loader's guess, for a file without general.file_type
        self._guessed_file_type = guess_file_type((t.name, t.type) for t in loaded.reader.tensors)

    @classmethod
    def load(cls, path: str | PathLike[str], *, load_mode: LoadMode = "auto", vocab_only: bool = False,
             progress_callback: Callable[[float], bool] | None = None,
             kv_overrides: Mapping[str, Any] | None = None, check_tensors: bool = False) -> Model:
        """Load a GGUF model.

        Parameters
        ----------
        path
            The ``.gguf`` file (for split models, the first part).
        load_mode
            ``"auto"`` (mmap, falling back to reading), ``"mmap"`` (weights are zero-copy views of
            the file), ``"none"`` (read into private memory), ``"mlock"`` (read and pin),
            ``"mmap+mlock"`` (map and pin).
        vocab_only
            Read metadata and vocabulary only, as llama.cpp does: no tensor is touched and no
            architecture class is needed, so any ``general.architecture`` loads (a full load of
            one gguflm cannot run raises UnknownArchitectureError). The model tokenizes; what
            needs the forward pass (``hparams``, ``architecture``, a Context) raises
            :class:`gguflm.VocabOnlyError`.
        progress_callback
            Called with the fraction of tensor bytes bound (0 … 1); returning False cancels the
            load with :class:`gguflm.LoadCancelled`.
        kv_overrides
            Metadata overrides applied before anything is read (llama.cpp's ``--override-kv``).
        check_tensors
            Scan tensor data for NaN/Inf (float tensors and the scales of quantized blocks).

        Raises
        ------
        gguflm.ModelLoadError
            With a subclass naming what went wrong (unknown architecture, missing key or tensor,
            wrong shape, wrong tensor count, unsupported type, bad data).
        """
        return cls(load(path, load_mode=load_mode, vocab_only=vocab_only,
                        progress_callback=progress_callback, kv_overrides=kv_overrides,
                        check_tensors=check_tensors))

    # -- the forward pass: a full load only

    @property
    def architecture(self) -> Architecture:
        """The forward pass (``gguflm/models/<arch>.py``)."""
        if self._architecture is None:
            raise self._vocab_only("architecture")
        return self._architecture

    @property
    def hparams(self) -> HParams:
        """The hyper-parameters the architecture reads (llama.cpp's ``llama_hparams``)."""
        if self._hparams is None:
            raise self._vocab_only("hyper-parameters")
        return self._hparams

    def _vocab_only(self, what: str) -> VocabOnlyError:
        return VocabOnlyError(f"{self.path.name} (arch {self.arch!r}) was loaded with "
                              f"vocab_only=True: it has no {what}")

    # -- facts

    @property
    def has_encoder(self) -> bool:
        """Whether the model has an encoder that ``Context.encode`` runs (llama_model_has_encoder)."""
        return self.architecture.has_encoder

    @property
    def has_decoder(self) -> bool:
        """Whether ``Context.decode`` runs a decoder (llama_model_has_decoder: all but t5encoder)."""
        return self.architecture.has_decoder

    @property
    def decoder_start_token(self) -> int:
        """The token an encoder-decoder model's decoder starts from, -1 if the file names none
        (llama_model_decoder_start_token)."""
        return int(self.hparams.extras.get("decoder_start_token_id", -1))

    @property
    def name(self) -> str:
        """``general.name`` ("" if absent), which llama.cpp reads even for a vocab-only load."""
        return self.meta.get("general.name", "")

    @property
    def n_params(self) -> int:
        """Parameters, counting a tied output matrix once."""
        return sum(w.n_elements for w in self._unique_weights())

    @property
    def size_bytes(self) -> int:
        return sum(w.nbytes for w in self._unique_weights())

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.size_bytes / self.n_params if self.n_params else 0.0

    @property
    def file_type(self) -> str:
        """``general.file_type``'s name ("Q4_K - Medium"), else the one llama.cpp guesses from the
        type most tensors have (:func:`gguflm.ggml_types.guess_file_type`)."""
        value = self.metadata.get("general.file_type")
        if isinstance(value, int) and value in FileType._value2member_map_:
            return FileType(value).display_name
        return f"{self._guessed_file_type.display_name} (guessed)"

    def _unique_weights(self) -> list[Weight]:
        seen: dict[int, Weight] = {}
        for w in self.tensors.values():
            seen.setdefault(id(w), w)
        return list(seen.values())

    def describe(self) -> str:
        """The summary llama.cpp's ``print_info`` logs: file, arch, sizes, BPW, hyper-parameters."""
        lines = [
            f"file format = GGUF V{self._gguf_version}",
            f"file type   = {self.file_type}",
        ]
        if not self.vocab_only:
            lines += [
                f"file size   = {self.size_bytes / 2**20:.2f} MiB ({self.bits_per_weight:.2f} BPW)",
                f"model params = {self.n_params / 1e6:.2f} M",
            ]
        if self.vocab_only:
            rows = [("arch", self.arch), ("vocab_only", "1"), ("n_vocab", str(self.n_vocab))]
        else:
            rows = self.hparams.describe()
        lines += [f"{name:<26} = {value}" for name, value in rows]
        lines.append(f"general.name = {self.name}")
        text = "\n".join(lines)
        for line in lines:
            log.info("print_info: %s", line)
        return text

    # -- lifetime

    def close(self) -> None:
        """Release the file map(s). Views handed out earlier must not be used afterwards."""
        self.tensors = {}
        self.layers = []
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        size = "vocab only" if self.vocab_only else f"{self.n_params / 1e6:.1f}M params"
        return f"Model({self.path.name!r}, arch={self.arch!r}, {size})"


def _meta_str(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return None
