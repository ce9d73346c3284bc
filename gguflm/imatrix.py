"""Importance matrices: llama-imatrix's files, read and written, and computed from a text.

An importance matrix holds, per weight matrix of the model, per input column, the sum over the
tokens of a text of the squared activation entering that matrix, and how many activation rows
were summed (per expert for MoE weights). The quantizer divides sums by counts and uses the
result as ggml's ``quant_weights`` (:func:`gguflm.quantize`'s ``imatrix``).

Two file formats, as llama.cpp's ``tools/imatrix`` and ``common/imatrix-loader`` use them:

* GGUF (the default): ``general.type = "imatrix"``, ``imatrix.datasets``, ``imatrix.chunk_count``,
  ``imatrix.chunk_size``; per weight ``NAME.in_sum2`` (F32, [n_per_row, n_mat]) and
  ``NAME.counts`` (F32, [1, n_mat]), tensors sorted by name.
* legacy ``.dat``: int32 entry count; per entry name length, name, ``ncall``, value count and
  float32 values already divided by the count and multiplied by ``ncall``; then the chunk count
  and the dataset name.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, Union

import numpy as np

from gguflm.errors import GGUFError

PathArg = Union[str, "PathLike[str]"]

KEY_DATASETS = "imatrix.datasets"
KEY_CHUNK_COUNT = "imatrix.chunk_count"
KEY_CHUNK_SIZE = "imatrix.chunk_size"
_SUMS, _COUNTS = ".in_sum2", ".counts"
_I32 = struct.Struct("<i")


@dataclass
class Imatrix:
    """An importance matrix: per weight name the column sums of squared activations
    (float32 [n_mat * n_per_row]) and the rows summed per matrix (int64 [n_mat])."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    is_legacy: bool = False
    has_metadata: bool = True

    def importance(self) -> dict[str, np.ndarray]:
        """Per weight the quantizer's importance weights, as llama-quantize's ``load_imatrix``:
        sums divided by each matrix's count (a matrix never seen: 1); legacy files divided by
        their ``ncall``."""
        out = {}
        for name, sums in self.sums.items():
            counts = self.counts[name]
            if self.is_legacy:
                ncall = int(counts[0]) if counts.size else 0
                out[name] = sums / np.float32(ncall) if ncall > 0 else sums.copy()
                continue
            per = sums.reshape(counts.size, -1)
            c = counts.astype(np.float32)[:, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                out[name] = np.where(c > 0, per / np.where(c > 0, c, 1), np.float32(1)).astype(
                    np.float32).reshape(-1)
        return out


def read_imatrix(path: PathArg) -> Imatrix:
    """Read a GGUF or legacy ``.dat`` importance matrix (llama.cpp's ``common_imatrix_load``)."""
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return _read_gguf(path)
    return _read_legacy(path)


def _read_gguf(path: Path) -> Imatrix:
    from gguflm.gguf import GGUFReader
    from gguflm.ggml_types import GGMLType

    with GGUFReader(path, mode="read") as r:
        if not r.tensors:
            raise GGUFError(f"{path}: no data in the importance matrix")
        found: dict[str, list[Any]] = {}
        for t in r.tensors:
            for suffix, slot in ((_SUMS, 0), (_COUNTS, 1)):
                if t.name.endswith(suffix):
                    found.setdefault(t.name[: -len(suffix)], [None, None])[slot] = t
        im = Imatrix()
        datasets = r.get(KEY_DATASETS)
        if isinstance(datasets, list):
            im.datasets = list(datasets)
        im.has_metadata = all(k in r.metadata for k in (KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE))
        im.chunk_count = int(r.get(KEY_CHUNK_COUNT, 0))
        im.chunk_size = int(r.get(KEY_CHUNK_SIZE, 0))
        for name in sorted(found):
            sums, counts = found[name]
            if sums is None or counts is None:
                raise GGUFError(f"{path}: mismatched sums and counts for {name}")
            if sums.type != GGMLType.F32 or counts.type != GGMLType.F32:
                raise GGUFError(f"{path}: sums and counts for {name} must be F32")
            im.sums[name] = np.array(sums.data, dtype=np.float32).reshape(-1)
            # std::lround: halves away from zero
            c = np.array(counts.data, dtype=np.float64).reshape(-1)
            im.counts[name] = (np.sign(c) * np.floor(np.abs(c) + 0.5)).astype(np.int64)
    return im


def _read_legacy(path: Path) -> Imatrix:
    raw = path.read_bytes()
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if pos + n > len(raw):
            raise GGUFError(f"{path}: not an importance matrix: file ends in {what}")
        out = raw[pos:pos + n]
        pos += n
        return out

    def i32(what: str) -> int:
        return _I32.unpack(take(4, what))[0]

    n_entries = i32("the entry count") if len(raw) >= 4 else 0
    if n_entries < 1:
        raise GGUFError(f"{path}: no data in the importance matrix")
    im = Imatrix(is_legacy=True, has_metadata=False)
    for i in range(n_entries):
        length = i32(f"entry {i + 1}")
        if length < 0:
            raise GGUFError(f"{path}: entry {i + 1} has a negative name length")
        name = take(length, f"the name of entry {i + 1}").split(b"\0")[0].decode("utf-8", "surrogateescape")
        ncall = i32(f"entry {name}")
        nval = i32(f"entry {name}")
        if nval < 1:
            raise GGUFError(f"{path}: failed reading number of values for entry {i}")
        im.sums[name] = np.frombuffer(take(4 * nval, f"the values of {name}"), "<f4").astype(np.float32)
        im.counts[name] = np.array([ncall], dtype=np.int64)
    if pos + 4 <= len(raw):  # optional: the chunk count and the dataset
        im.chunk_count = i32("the chunk count")
        if pos + 4 <= len(raw):
            length = i32("the dataset")
            if length > 0 and pos + length <= len(raw):
                im.datasets.append(take(length, "the dataset").split(b"\0")[0].decode("utf-8", "replace"))
    return im


def write_imatrix(path: PathArg, im: Imatrix) -> Path:
    """Write ``im`` in llama-imatrix's GGUF format (byte for byte as its ``save_imatrix``)."""
    from gguflm.gguf import GGUFWriter
    from gguflm.gguf.constants import GGUFValueType as V

    w = GGUFWriter(path)
    w.add("general.type", "imatrix")
    w.add(KEY_DATASETS, list(im.datasets), V.ARRAY, V.STRING)
    w.add(KEY_CHUNK_COUNT, int(im.chunk_count), V.UINT32)
    w.add(KEY_CHUNK_SIZE, int(im.chunk_size), V.UINT32)
    for name in sorted(im.sums, key=lambda n: n.encode("utf-8", "surrogateescape")):
        sums, counts = im.sums[name], im.counts[name]
        n_mat = counts.size
        if sums.size == 0 or n_mat == 0:
            continue
        n_per_row = sums.size // n_mat
        # ggml_n_dims drops a trailing 1: a dense weight's rows are 1-D
        w.add_tensor(name + _SUMS, np.asarray(sums, np.float32).reshape(n_mat, n_per_row),
                     shape=(n_per_row, n_mat) if n_mat > 1 else (n_per_row,))
        w.add_tensor(name + _COUNTS, counts.astype(np.float32).reshape(n_mat, 1),
                     shape=(1, n_mat) if n_mat > 1 else (1,))
    return w.write()[0]


def write_imatrix_legacy(path: PathArg, im: Imatrix, dataset: str = "") -> Path:
    """Write ``im`` in the legacy ``.dat`` format (llama-imatrix's ``save_imatrix_legacy``);
    entries without data are skipped as there."""
    chunk = max(im.chunk_size, 1)
    body = bytearray()
    n = 0
    for name in sorted(im.sums, key=lambda s: s.encode("utf-8", "surrogateescape")):
        sums, counts = np.asarray(im.sums[name], np.float32), im.counts[name]
        if counts.size == 0 or not counts.any():
            continue
        n += 1
        raw_name = name.encode("utf-8", "surrogateescape")
        ncall = int((int(counts.max()) + chunk - 1) // chunk)
        body += _I32.pack(len(raw_name)) + raw_name + _I32.pack(ncall) + _I32.pack(sums.size)
        c = np.repeat(counts.astype(np.float32), sums.size // counts.size)
        empty = c == 0
        values = np.where(empty, np.float32(1), sums) / np.where(empty, np.float32(1), c)
        body += (values.astype(np.float32) * np.float32(ncall)).astype("<f4").tobytes()
    name = dataset or (im.datasets[-1] if im.datasets else "")
    raw = name.encode("utf-8")
    data = _I32.pack(n) + bytes(body) + _I32.pack(im.chunk_count) + _I32.pack(len(raw)) + raw
    path = Path(path)
    path.write_bytes(data)
    return path


# ---- collecting


class ImatrixCollector:
    """Accumulates llama-imatrix's statistics from :class:`gguflm.Context`'s matmul inputs.

    As llama-imatrix's ``collect_imatrix``: dense weights of blocks (``blk.*``; ``output.weight``
    too with ``process_output``) from ubatches of at least 16 tokens, one count per input row;
    expert weights from every ubatch, per expert: each (token, slot) routed to it adds its row
    and one count.
    """

    def __init__(self, weight_shapes: Mapping[str, tuple[int, ...]], process_output: bool = False):
        self.shapes = dict(weight_shapes)
        self.process_output = process_output
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, np.ndarray] = {}

    def _entry(self, name: str, n_per_row: int, n_mat: int) -> tuple[np.ndarray, np.ndarray]:
        if name not in self.sums:
            self.sums[name] = np.zeros((n_mat, n_per_row), np.float32)
            self.counts[name] = np.zeros(n_mat, np.int64)
        return self.sums[name], self.counts[name]

    def __call__(self, ob: Any) -> None:
        x = ob.x
        for name in ob.names:
            if ob.route is not None:
                self._collect_experts(name, x, ob.route, ob.by_expert)
            elif x.shape[0] >= 16 and (name.startswith("blk.") or (self.process_output and name == "output.weight")):
                shape = self.shapes.get(name, (x.shape[1],))
                n_mat = int(np.prod(shape[2:], dtype=np.int64)) if len(shape) > 2 else 1
                sums, counts = self._entry(name, x.shape[1], n_mat)
                sums += np.square(x).sum(axis=0, dtype=np.float32)   # a 2-D input feeds every matrix
                counts += x.shape[0] // n_mat if n_mat > 1 else x.shape[0]

    def _collect_experts(self, name: str, x: np.ndarray, route: tuple[np.ndarray, ...], by_expert: bool) -> None:
        ids, offsets = route[0], route[2]
        n_expert = len(offsets) - 1
        sums, counts = self._entry(name, x.shape[1], n_expert)
        sq = np.square(x)
        if by_expert:   # rows already one per (token, slot), grouped by expert
            for e in range(n_expert):
                lo, hi = int(offsets[e]), int(offsets[e + 1])
                if hi > lo:
                    sums[e] += sq[lo:hi].sum(axis=0, dtype=np.float32)
                    counts[e] += hi - lo
        else:           # one row per token, used by each of its slots
            for e in range(n_expert):
                rows = np.flatnonzero((ids == e).any(axis=1))
                uses = int((ids == e).sum())
                if uses:
                    per_use = (ids[rows] == e).sum(axis=1).astype(np.float32)
                    sums[e] += (sq[rows] * per_use[:, None]).sum(axis=0, dtype=np.float32)
                    counts[e] += uses

    def imatrix(self, chunk_count: int, chunk_size: int, datasets: Sequence[str] = ()) -> Imatrix:
        for name, sums in self.sums.items():
            if not np.isfinite(sums).all():
                raise ValueError(f"non-finite values detected in {name}")
        return Imatrix({n: s.reshape(-1).copy() for n, s in self.sums.items()},
                       {n: c.copy() for n, c in self.counts.items()}, list(datasets), chunk_count, chunk_size)


@dataclass
class ImatrixResult:
    """What :func:`compute_imatrix` made: the matrix and llama-imatrix's perplexity estimate."""

    imatrix: Imatrix
    ppl: float
    n_chunks: int
    n_tokens: int


def compute_imatrix(model: Any, text: str, *, n_ctx: int = 512, n_chunks: int | None = None,
                    dataset: str = "", process_output: bool = False, n_threads: int | None = None,
                    on_chunk: Callable[[int, int, float], object] | None = None) -> ImatrixResult:
    """llama-imatrix's importance matrix of ``model`` over ``text``.

    The text is tokenized with ``add_special`` and cut into chunks of ``n_ctx`` tokens (at most
    ``len(tokens) // n_ctx``, at least two chunks' worth of tokens needed); each chunk is
    decoded from an empty cache with its first token replaced by BOS when the model adds BOS and
    every position producing output, so every token's activations count. The perplexity of the
    second half of each chunk is computed along, as llama-imatrix prints it.

    Parameters
    ----------
    model
        A loaded :class:`gguflm.Model`.
    text
        The calibration text.
    n_ctx
        Tokens per chunk (llama-imatrix's ``-c``); also the stored ``chunk_size``.
    n_chunks
        At most this many chunks (``--chunks``; None: all).
    dataset
        Name recorded in ``imatrix.datasets`` (llama-imatrix records its ``-f`` file).
    process_output
        Collect ``output.weight`` too (``--process-output``).
    """
    from gguflm.batch import Batch
    from gguflm.context import Context
    from gguflm.errors import Error
    from gguflm.perplexity import chunk_nll

    if n_ctx < 4 or n_ctx % 2:
        raise ValueError(f"n_ctx must be an even number >= 4, got {n_ctx}")
    if n_chunks is not None and n_chunks < 1:
        raise ValueError(f"n_chunks must be >= 1 or None, got {n_chunks}")
    vocab = model.vocab
    tokens = np.asarray(vocab.tokenize(text, add_special=True, parse_special=False), np.int32)
    if len(tokens) < 2 * n_ctx:
        raise ValueError(f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; "
                         f"the text tokenizes to only {len(tokens)}")
    total = len(tokens) // n_ctx if n_chunks is None else min(n_chunks, len(tokens) // n_ctx)
    shapes = {name: w.shape for name, w in model.tensors.items()}
    collector = ImatrixCollector(shapes, process_output)
    first = n_ctx // 2
    nll = 0.0
    count = 0
    ctx = Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(512, n_ctx), n_threads=n_threads)
    ctx.matmul_observer = collector
    try:
        for i in range(total):
            chunk = tokens[i * n_ctx:(i + 1) * n_ctx].copy()
            if vocab.add_bos and vocab.bos is not None:
                chunk[0] = vocab.bos
            ctx.memory.seq_rm(0, -1, -1)
            batch = Batch(n_ctx)
            batch.token[:] = chunk
            batch.pos[:] = np.arange(n_ctx)
            batch.n_seq_id[:] = 1
            batch.seq_id[:, 0] = 0
            batch.logits[:] = 1
            batch.n_tokens = n_ctx
            status = ctx.decode(batch)
            if status != 0:
                raise Error(f"decode failed with status {status} while collecting the imatrix")
            logits = ctx.get_logits()
            if logits is not None and len(logits):
                values = chunk_nll(logits[first:-1], chunk[first + 1:])
                nll += float(values.sum())
                count += len(values)
            if on_chunk is not None:
                on_chunk(i + 1, total, float(np.exp(nll / count)) if count else float("nan"))
    finally:
        ctx.close()
    im = collector.imatrix(total, n_ctx, [dataset] if dataset else [])
    return ImatrixResult(im, float(np.exp(nll / count)) if count else float("nan"), total, len(tokens))
