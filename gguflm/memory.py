"""How much memory a model and a context will take, from the GGUF file's metadata alone.

A desktop application wants the figure before it loads anything: whether a model fits, and the
largest context that does. :func:`estimate_memory` reads the header and tensor index (no weight
byte), lays out the KV cache as :class:`gguflm.Context` would (sliding-window layers in their own
window-sized cache) and asks the real planner for the compute buffers of a full ubatch and of a
single-token step (:meth:`gguflm.Context.compute_buffer_size`, with a cache that is never written,
so nothing becomes resident). :func:`fit_context` searches the largest ``n_ctx`` under a budget.

The parts add up to the resident memory the process gains from loading the model, creating the
context and running a prompt and a generation (measured in ``tests/test_memory.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from gguflm import quants
from gguflm.context import CTX_PAD, Context
from gguflm.errors import GGUFError, ModelLoadError
from gguflm.gguf import GGUFReader
from gguflm.hparams import HParamReader
from gguflm.loader import LoadedModel, LoadedNetwork, _bind_tensors, held_types
from gguflm.lora import LoraAdapter
from gguflm.model import Model
from gguflm.models import get_architecture

log = logging.getLogger("gguflm")

# The vocabulary's Python and tokenizer tables, per token and per BPE merge, plus a fixed part
# (pre-tokenizer regexes, special-token tables): a least-squares fit of the resident growth of a
# vocab-only load in a fresh process over llama.cpp's tokenizer test files (SPM, BPE, WPM; 32k to
# 262k tokens), within 2 MB of each but one.
_VOCAB_FIXED = 1_370_000
_VOCAB_PER_TOKEN = 280
_VOCAB_PER_MERGE = 185
# What the first forward pass adds whatever the model: the kernels' code pages it maps in and the
# thread team's stacks (measured: ~3.3 MiB of code, ~1 MiB of stacks and plan objects)
_RUNTIME = 4 << 20
_KV_CELL_BOOKKEEPING = 4 + 8 + 4  # per cell: position (int32), sequence bits (uint64), shift (int32)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes each part of a loaded model and one context holds; ``total`` is their sum.

    Attributes
    ----------
    weights
        The mapped file (header and tensors): every page is read by the first forward pass; plus
        what the weights a load holds in a larger type's blocks (:func:`gguflm.loader.held_types`)
        add.
    kv_cache
        K and V rows of every layer for every cell, sliding-window layers in their window-sized
        cache, and the cells' bookkeeping.
    compute
        The activation buffers of the two recorded forward passes a chat keeps: a full ubatch
        (prompt) and a single token (generation), and the logits row copied out of each step.
    vocab
        The vocabulary and tokenizer tables.
    runtime
        What running any model adds once: kernel code pages, thread stacks.
    """

    weights: int
    kv_cache: int
    compute: int
    vocab: int
    runtime: int
    n_ctx: int                  # the context size these figures are for (padded, as Context does)
    kv_cells: tuple[int, ...]   # cells of each cache (global layers, then sliding-window layers)

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute + self.vocab + self.runtime

    def describe(self) -> str:
        """One line per part, in MiB."""
        parts = [("weights", self.weights), ("kv cache", self.kv_cache), ("compute", self.compute),
                 ("vocab", self.vocab), ("runtime", self.runtime), ("total", self.total)]
        return "\n".join(f"{name:<9} {value / 2**20:9.1f} MiB" for name, value in parts)


class _SizingContext(Context):
    """A context used only for its shapes: the cache is never written, so it never becomes resident."""

    _commit_kv = False


def _open_network(path: Path) -> Model:
    """The model's hyper-parameters and tensor views, without the vocabulary: nothing but the
    header is read (tensor views of a memory map read no byte until used)."""
    reader = GGUFReader(path, mode="mmap")
    try:
        meta = reader.metadata
        arch_name = meta.get("general.architecture")
        if not isinstance(arch_name, str):
            raise ModelLoadError(f"{path.name}: key not found in model: general.architecture")
        arch = get_architecture(arch_name)
        kv = HParamReader(arch_name, meta, path.name)
        n_vocab = kv.get_int("{arch}.vocab_size", len(meta.get("tokenizer.ggml.tokens") or ()))
        hparams = arch.read_hparams(kv, n_vocab)
        weights = _bind_tensors(reader, arch, hparams, path.name, None, False)
    except BaseException:
        reader.close()
        raise
    return Model(LoadedModel(path, reader, meta, arch_name, n_vocab, None,  # type: ignore[arg-type]
                             LoadedNetwork(arch, hparams, weights), "mmap"))


def _vocab_bytes(model: Model) -> int:
    meta = model.metadata
    n_tokens = len(meta.get("tokenizer.ggml.tokens") or ())
    n_merges = len(meta.get("tokenizer.ggml.merges") or ())
    return _VOCAB_FIXED + _VOCAB_PER_TOKEN * n_tokens + _VOCAB_PER_MERGE * n_merges


def _weight_bytes(model: Model) -> int:
    reader = model._reader
    paths = getattr(reader, "paths", None) or [model.path]
    weights = {id(w): w for w in model.tensors.values()}
    grown = sum(weights[i].data.shape[0] * (quants.get(t).row_bytes(weights[i].shape[0])
                                            - quants.get(weights[i].type).row_bytes(weights[i].shape[0]))
                for i, t in held_types(model.tensors).items())
    return sum(Path(p).stat().st_size for p in paths) + grown


def _estimate(model: Model, n_ctx: int, type_k: str, type_v: str, n_seq_max: int, n_ubatch: int,
              n_batch: int, kv_unified: bool, adapters: Sequence[LoraAdapter] = ()) -> MemoryEstimate:
    ctx = _SizingContext(model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq_max,
                         n_threads=1, type_k=type_k, type_v=type_v, kv_unified=kv_unified)
    ctx.set_adapters_lora(adapters, [1.0] * len(adapters))
    try:
        caches = ctx._caches
        kv = sum(c.nbytes + c.size * _KV_CELL_BOOKKEEPING for c in caches)
        logits_row = 4 * model.hparams.n_vocab  # the context's copy of one output row
        compute = ctx.compute_buffer_size(ctx.n_ubatch) + logits_row
        if ctx.n_ubatch > 1:
            compute += ctx.compute_buffer_size(1) + logits_row
        return MemoryEstimate(weights=_weight_bytes(model) + sum(a.nbytes for a in adapters), kv_cache=kv,
                              compute=compute,
                              vocab=_vocab_bytes(model), runtime=_RUNTIME, n_ctx=ctx.n_ctx,
                              kv_cells=tuple(c.size for c in caches))
    finally:
        ctx.close()


def estimate_memory(path: str | PathLike[str], n_ctx: int = 0, type_k: str = "f16", type_v: str = "f16",
                    n_seq_max: int = 1, n_ubatch: int = 512, n_batch: int = 2048,
                    kv_unified: bool = True, lora_adapters: Iterable[str | PathLike[str]] = ()) -> MemoryEstimate:
    """The resident memory of loading ``path`` and running one context with these parameters.

    Parameters are :class:`gguflm.Context`'s (``n_ctx`` 0 takes the model's training context;
    ``kv_unified=False`` with ``n_seq_max`` > 1 lays the cache out in one region per sequence, as
    the context does). Only the GGUF header is read, and the LoRA adapter files given (their
    matrices count as weights, their products in the compute buffers).

    Raises
    ------
    gguflm.ModelLoadError
        The file is not a GGUF model gguflm can run (unknown architecture, missing keys or
        tensors).
    ValueError
        Invalid context parameters.
    """
    path = Path(path)
    try:
        model = _open_network(path)
    except GGUFError as exc:
        raise ModelLoadError(str(exc)) from exc
    with model:
        adapters = [LoraAdapter.load(model, p) for p in lora_adapters]
        return _estimate(model, n_ctx, type_k, type_v, n_seq_max, n_ubatch, n_batch, kv_unified, adapters)


def fit_context(path: str | PathLike[str], budget_bytes: int, type_k: str = "f16", type_v: str = "f16",
                n_seq_max: int = 1, n_ubatch: int = 512, n_batch: int = 2048, kv_unified: bool = True) -> int:
    """The largest ``n_ctx`` (a multiple of 256, at most the training context) whose
    :func:`estimate_memory` total fits in ``budget_bytes``; 0 when not even 256 fits."""
    path = Path(path)
    try:
        model = _open_network(path)
    except GGUFError as exc:
        raise ModelLoadError(str(exc)) from exc
    with model:
        def fits(n: int) -> bool:
            return _estimate(model, n, type_k, type_v, n_seq_max, n_ubatch, n_batch, kv_unified).total <= budget_bytes

        # the total grows with n_ctx (cache cells and the attention's reach): bisect over multiples of 256
        lo, hi = 0, max(1, model.hparams.n_ctx_train // CTX_PAD)
        if fits(hi * CTX_PAD):
            return hi * CTX_PAD
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid * CTX_PAD):
                lo = mid
            else:
                hi = mid
        log.info("fit_context: %s fits n_ctx = %d in %.1f MiB", path.name, lo * CTX_PAD, budget_bytes / 2**20)
        return lo * CTX_PAD
