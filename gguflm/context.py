"""The context: KV cache, decode, outputs, state (llama.cpp's llama_context).

``decode(batch)`` completes and validates the batch, splits it into ubatches of at most
``n_ubatch`` tokens, reserves cache cells for all of them before computing any, then runs the
model's forward pass per ubatch and collects the requested logits (and embeddings) in batch
order. Status codes are llama.cpp's: 0 ok, 1 no cache room (nothing changed), 2 aborted (finished
ubatches stay), -1 invalid batch.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from gguflm import kv_cache
from gguflm.batch import Batch, BatchAllocator, InvalidBatchError, UBatch
from gguflm.control_vector import ControlVectors
from gguflm.errors import EncoderError, Error, StateError, VocabOnlyError
from gguflm._ext.plan import Plan
from gguflm.graph import Aborted, Arena, Graph, MatmulObservation, apply_rope
from gguflm.kv_cache import KVCache, Memory
from gguflm.kv_store import check_cache_type
from gguflm.lora import LoraAdapter
from gguflm.memory_hybrid import HybridMemory
from gguflm.memory_recurrent import RecurrentCache, RecurrentMemory
from gguflm.model import Model
from gguflm.pooling import PoolingType, pooling_inputs, resolve
from gguflm.rope import RopeParams, rope_params
from gguflm.system import guard_mode
from gguflm.threads import resolve_n_threads

log = logging.getLogger("gguflm")

CTX_PAD = 256           # n_ctx and window caches are padded to this, as llama.cpp's KV cache
MAX_SEQ = 64            # sequence ids are bits of a uint64 per cell
MAX_SEQ_NO_CACHE = 256  # llama.cpp's LLAMA_MAX_SEQ, for encoders (no cache cells to mark)
STATE_MAGIC = "gguflm-state-v2"
SEQ_STATE_MAGIC = "gguflm-seq-state-v2"
_MAX_PLANS = 8   # a prompt's shapes, generation's one token and speculative drafts' 1, 2, 4, 8, 16


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class EncoderOutput:
    """What an encoder-decoder model's encode leaves for the decoder's cross-attention (llama.cpp's
    ``llama_cross``): the final hidden states and each row's position and first sequence."""

    def __init__(self, n_rows: int, n_embd: int) -> None:
        self.embd = np.zeros((n_rows, n_embd), np.float32)   # [n_enc, n_embd]
        self.pos = np.zeros(n_rows, np.int32)
        self.seq = np.zeros(n_rows, np.int32)
        self.n_rows = np.array([n_rows], np.int32)           # the cross-attention's cell count


class Context:
    """An inference session over a :class:`Model`: KV cache, decode, outputs.

    Parameters follow llama.cpp's ``llama_context_params``: ``n_ctx`` 0 takes the model's training
    context; it is padded up to a multiple of 256. ``n_threads`` runs single-token decodes,
    ``n_threads_batch`` everything else (both default to the usable physical cores). ``type_k``/``type_v``
    are ``"f32"``, ``"f16"`` or ``"q8_0"``. ``abort_callback()`` returning True stops decode
    between ubatches and layers.

    ``embeddings=True`` makes every token an output and keeps the final hidden states;
    ``pooling`` (a name of :data:`gguflm.pooling.POOLING_NAMES`, llama.cpp's number, or None
    for the model's own ``{arch}.pooling_type``) pools them per sequence into
    :meth:`get_embeddings_seq`. Encoders (BERT and kin) have no KV cache: a batch must fit in one
    ubatch, every decode starts afresh, and up to 256 sequences may share a batch. A model with an
    encoder (T5) runs it with :meth:`encode`; an encoder-decoder one keeps its output for the
    decoder's cross-attention in every later :meth:`decode`. ``logits=False``
    skips the output projection (a context that only reads embeddings; llama.cpp computes it).
    ``kv_unified=False`` gives each of the ``n_seq_max`` sequences its own region of the cache
    (``n_ctx / n_seq_max`` cells, each padded to 256), as llama.cpp's per-sequence KV streams:
    a sequence's logits then do not depend on what the other sequences hold.
    """

    # the KV cache is written through once at creation, as llama.cpp clears its buffers: the
    # memory is resident from the start (a cache that does not fit fails now, not mid-chat, and
    # gguflm.estimate_memory's figure is what the process holds)
    _commit_kv = True

    def __init__(self, model: Model, n_ctx: int = 0, n_batch: int = 2048, n_ubatch: int = 512,
                 n_seq_max: int = 1, n_threads: int | None = None, n_threads_batch: int | None = None,
                 type_k: str = "f16", type_v: str = "f16", embeddings: bool = False,
                 pooling: str | None = None, rope_freq_base: float = 0.0, rope_freq_scale: float = 0.0,
                 swa_full: bool = False, abort_callback: Callable[[], bool] | None = None,
                 logits: bool = True, kv_unified: bool = True, rope_scaling_type: int | str | None = None,
                 yarn_ext_factor: float = -1.0, yarn_attn_factor: float = -1.0, yarn_beta_fast: float = -1.0,
                 yarn_beta_slow: float = -1.0, yarn_orig_ctx: int = 0):
        t0 = time.perf_counter()
        if model.vocab_only:
            raise VocabOnlyError(f"cannot create a context from {model.path.name}: it was loaded "
                                 f"with vocab_only=True (arch {model.arch!r})")
        if not model.tensors:
            raise Error(f"cannot create a context from {model.path.name}: the model is closed")
        hp = model.hparams
        if n_ctx < 0 or n_batch < 1 or n_ubatch < 1:
            raise ValueError("n_ctx must be >= 0, n_batch and n_ubatch >= 1")
        kv_cache = model.architecture.kv_cache
        max_seq = MAX_SEQ if kv_cache else MAX_SEQ_NO_CACHE
        if not 1 <= n_seq_max <= max_seq:
            raise ValueError(f"n_seq_max must be in [1, {max_seq}], got {n_seq_max}")
        for il in {hp.is_swa(il): il for il in range(hp.n_layer)}.values():   # a layer of each kind (head sizes)
            check_cache_type("type_k", type_k, hp.head_k(il))
            check_cache_type("type_v", type_v, hp.head_v(il))
        if hp.is_mla and type_k not in ("f16", "f32"):
            # V is read from K's rows transposed, which ggml does for float rows only
            raise ValueError(f"type_k {type_k}: a model with multi-head latent attention ({hp.arch}) keeps V in "
                             f"the K cache, which must then be f16 or f32")
        self.pooling_type = resolve(pooling, hp)
        self.model = model
        n_stream = 1 if kv_unified or not kv_cache else n_seq_max
        self.kv_unified = n_stream == 1
        self.n_ctx = _pad(n_ctx or hp.n_ctx_train, CTX_PAD)
        if n_stream > 1:
            self.n_ctx = _pad(-(-self.n_ctx // n_stream), CTX_PAD) * n_stream
        self.n_batch = min(self.n_ctx, n_batch) if hp.causal_attn else n_batch
        self.n_ubatch = min(self.n_batch, n_ubatch)
        self.n_seq_max = n_seq_max
        self.n_threads = resolve_n_threads(n_threads)
        self.n_threads_batch = resolve_n_threads(n_threads_batch if n_threads_batch is not None else n_threads)
        self.type_k, self.type_v = type_k, type_v
        self.embeddings = embeddings
        self.logits = logits
        self.pooling = self.pooling_type.label
        self.swa_full = swa_full
        self.abort_callback = abort_callback
        self.rope_freq_base = rope_freq_base or hp.rope_freq_base_train
        self.rope_freq_scale = rope_freq_scale or hp.rope_freq_scale_train
        self.rope = rope_params(hp, rope_scaling_type, self.rope_freq_scale, yarn_ext_factor, yarn_attn_factor,
                                yarn_beta_fast, yarn_beta_slow, yarn_orig_ctx, self.rope_freq_base)
        self.rope_scaling_type = self.rope.scaling_type
        self.rope_freq_scale = self.rope.freq_scale

        # one cache for global layers, one window-sized cache for sliding-window layers, then the
        # recurrent states (a recurrent or hybrid model's), as llama.cpp saves a hybrid memory
        arch = model.architecture
        attn_layers = arch.attention_layers(hp) if kv_cache else []
        rs_layers = arch.recurrent_layers(hp)
        swa = [il for il in attn_layers if hp.is_swa(il)]
        full = [il for il in attn_layers if not hp.is_swa(il)]
        if n_stream > 1:
            region = self.n_ctx // n_stream
            swa_size = n_stream * (region if swa_full else min(region, _pad(hp.n_swa + self.n_ubatch, CTX_PAD)))
        else:
            swa_size = self.n_ctx if swa_full else min(self.n_ctx, _pad(hp.n_swa * n_seq_max + self.n_ubatch, CTX_PAD))
        self._caches: list[KVCache | RecurrentCache] = []
        self._cache_of_layer: dict[int, int] = {}
        self._recurrent_of_layer: dict[int, int] = {}
        for layers, size, window in ((full, self.n_ctx, 0), (swa, swa_size, hp.n_swa)):
            if layers:
                for il in layers:
                    self._cache_of_layer[il] = len(self._caches)
                # multi-head latent attention reads V from K's rows: no V rows of their own
                n_embd_v = (lambda il: 0) if hp.is_mla else hp.n_embd_v_gqa
                self._caches.append(KVCache(size, layers, hp.n_embd_k_gqa, n_embd_v, type_k,
                                            type_v, n_seq_max, n_swa=window, n_stream=n_stream,
                                            head_dim_k=hp.head_k(layers[0]), head_dim_v=hp.head_v(layers[0]),
                                            chunked=hp.swa_chunked))
        if rs_layers:   # one conv and one SSM state per sequence, in max(1, n_seq_max) cells
            self._recurrent_of_layer = dict.fromkeys(rs_layers, len(self._caches))
            self._caches.append(RecurrentCache(n_seq_max, rs_layers, *arch.state_sizes(hp), n_seq_max))
        if self._commit_kv:
            for cache in self._caches:
                cache.commit()
        if arch.memory == "hybrid":
            self.memory = HybridMemory(self._caches[:-1], self._caches[-1], n_seq_max)
        elif arch.memory == "recurrent":
            self.memory = RecurrentMemory(self._caches[0], n_seq_max)
        else:
            self.memory = Memory(self._caches, n_seq_max)
        # a recurrent state needs equal-length sequences per ubatch; consecutive sequence ids
        # (llama.cpp's sequential split) for a recurrent memory, or a hybrid's KV cache in regions
        self._balloc = BatchAllocator(hp, arch.max_positions(hp), self.memory, bool(self._caches),
                                      n_seq_max, self.n_batch, self.n_ubatch, embeddings,
                                      self.pooling_type if self._pools else None,
                                      equal_split=bool(rs_layers),
                                      sequential=arch.memory == "recurrent" or n_stream > 1)
        # an encoder-decoder model's encoder pass: one ubatch, every token an output, no cells
        self._enc_balloc = BatchAllocator(hp, None, self.memory, False, n_seq_max, self.n_batch, self.n_ubatch,
                                          True, None)
        self._encoding = False   # the pass being recorded or run is the encoder's (encode)
        # the encoder's output the decoder attends over (EncoderOutput), once encode has run
        self.encoder_output: EncoderOutput | None = None

        # recorded forward passes by ubatch shape, most recently used last
        self._plans: OrderedDict[tuple[int, int, bool], Plan] = OrderedDict()
        # by ubatch shape: each plan's matmul inputs by the segment before which they are complete
        self._observations: dict[tuple[int, int, bool], dict[int, list[MatmulObservation]]] = {}
        # called with every matmul input of multi-token ubatches as decode computes them (the
        # array is valid only during the call): what an importance matrix is collected from
        self.matmul_observer: Callable[[MatmulObservation], None] | None = None
        self._rope_configs = [self._make_rope_config(il) for il in range(hp.n_layer)]
        # adapters: the LoRA adapters and scales in the order the forward pass adds them, and the
        # control vector
        self.lora_order: list[tuple[LoraAdapter, float]] = []
        self.cvec = ControlVectors(hp.n_layer, hp.n_embd)
        self._logits: np.ndarray | None = None      # [n_outputs, n_vocab] (None: the model has no head)
        self._embd: np.ndarray | None = None        # [n_outputs, n_embd]
        self._embd_seq: dict[int, np.ndarray] = {}
        self._output_ids = np.zeros(0, np.int32)    # batch index → output row, -1 = none
        self._n_outputs = 0
        self._perf = {"t_p_eval_ms": 0.0, "n_p_eval": 0, "t_eval_ms": 0.0, "n_eval": 0, "n_reused": 0}
        self._t_start = time.perf_counter()
        self.t_load_ms = (self._t_start - t0) * 1e3
        self.describe()

    # -- configuration facts

    def rope_config(self, il: int) -> RopeParams:
        """The RoPE parameters of layer ``il`` in this context."""
        return self._rope_configs[il]

    def _make_rope_config(self, il: int) -> RopeParams:
        hp = self.model.hparams
        swa = hp.is_swa(il)
        # frequency factors: Llama 3.1's, or Phi 3's long/short set chosen by the context size
        tensors = self.model.tensors
        factors = tensors.get("rope_freqs.weight") or (
            tensors.get("rope_factors_long.weight") if self.n_ctx // self.n_seq_max > hp.n_ctx_orig_yarn
            else tensors.get("rope_factors_short.weight"))
        return replace(
            self.rope,
            freq_base=hp.rope_freq_base_train_swa if swa else self.rope.freq_base,
            freq_scale=hp.rope_freq_scale_train_swa if swa else self.rope.freq_scale,
            freq_factors=None if factors is None or (swa and not hp.rope_freqs_swa) else factors.data,
        )

    def cache_for_layer(self, il: int) -> tuple[int, KVCache]:
        """The index and KV cache of attention layer ``il`` (a context of an encoder has none)."""
        index = self._cache_of_layer[il]
        return index, self._caches[index]

    def recurrent_for_layer(self, il: int) -> tuple[int, RecurrentCache]:
        """The index and recurrent memory holding layer ``il``'s states (a recurrent layer's)."""
        index = self._recurrent_of_layer[il]
        return index, self._caches[index]

    def describe(self) -> dict[str, Any]:
        """The effective parameters and KV cache size, logged and returned."""
        info = {
            "n_ctx": self.n_ctx, "n_batch": self.n_batch, "n_ubatch": self.n_ubatch,
            "n_seq_max": self.n_seq_max, "kv_unified": self.kv_unified, "n_threads": self.n_threads,
            "n_threads_batch": self.n_threads_batch, "type_k": self.type_k, "type_v": self.type_v,
            "embeddings": self.embeddings, "pooling": self.pooling, "swa_full": self.swa_full,
            "freq_base": self.rope_freq_base, "freq_scale": self.rope_freq_scale,
            "rope_scaling": self.rope_scaling_type,
            "kv_cells": [c.size for c in self._caches],
            "kv_size_mib": self.memory.nbytes / 2**20,
        }
        log.info("context: %s", ", ".join(f"{k} = {v}" for k, v in info.items()))
        return info

    # -- adapters

    def set_adapters_lora(self, adapters: Sequence[LoraAdapter], scales: Sequence[float]) -> None:
        """Use these LoRA adapters of this context's model at these scales from the next decode
        on (llama.cpp's ``llama_set_adapters_lora``); an empty list clears them. Cheap: the model
        is untouched, only the recorded forward passes are dropped.

        As in llama.cpp, an adapter of scale 0 is left out and an adapter listed twice keeps its
        first scale. The corrections of one matrix add up in llama.cpp's order, that of its hash
        map of adapters: the reverse of the list for up to two adapters (for more, llama.cpp's
        order depends on where its adapters lie in memory)."""
        if len(adapters) != len(scales):
            raise ValueError(f"{len(adapters)} adapters but {len(scales)} scales")
        order: dict[int, tuple[LoraAdapter, float]] = {}
        for adapter, scale in zip(adapters, scales):
            if not isinstance(adapter, LoraAdapter):
                raise TypeError(f"expected a gguflm.lora.LoraAdapter, got {type(adapter).__name__}")
            if adapter.model is not self.model:
                raise ValueError(f"{adapter.path.name} was loaded for another model than this context's")
            if scale != 0.0:
                order.setdefault(id(adapter), (adapter, float(np.float32(scale))))
        lora_order = list(order.values())[::-1]
        if [(id(a), s) for a, s in lora_order] != [(id(a), s) for a, s in self.lora_order]:
            self.lora_order = lora_order
            self._drop_plans()

    def set_adapter_cvec(self, data: np.ndarray | None, n_embd: int, il_start: int, il_end: int) -> None:
        """Add a control vector to the output of layers ``il_start`` to ``il_end`` (inclusive)
        from the next decode on (llama.cpp's ``llama_set_adapter_cvec``): ``data`` float32 laid
        out as :func:`gguflm.control_vector.load_control_vectors` returns it (layer 1's
        ``n_embd`` values first; layers past its end keep what an earlier call gave them, zero at
        first); None turns it off. ``n_embd`` other than the model's raises ValueError."""
        self.cvec.apply(data, n_embd, il_start, il_end)
        self._drop_plans()

    def _drop_plans(self) -> None:
        """Forget the recorded forward passes: the next decode records them with what changed."""
        self._plans.clear()
        self._observations.clear()

    # -- decode

    def _check_abort(self) -> None:
        if self.abort_callback is not None and self.abort_callback():
            raise Aborted()

    def _observing(self, shape: tuple[int, int, bool]) -> Callable[[], None]:
        """A check_abort for Plan.run that also hands each segment's finished matmul inputs to
        the observer (Plan.run calls it before every segment, in order)."""
        by_segment, observer, count = self._observations.get(shape, {}), self.matmul_observer, [0]

        def before_segment() -> None:
            self._check_abort()
            for ob in by_segment.get(count[0], ()):
                observer(ob)
            count[0] += 1
        return before_segment

    def decode(self, batch: Batch, per_token: bool = False) -> int:
        """Run the model over ``batch``; returns 0, 1 (no cache room), 2 (aborted), -1 (invalid).

        ``per_token``: every token's logits round as a one-token ubatch's would (gguflm's own:
        llama.cpp's, like the default here, change with the ubatch's size, as its matmuls and
        attention take other recipes for batches), at about a batch's cost. Speculative decoding
        checks drafts so, for the tokens generation without it gives. Mixture-of-experts layers
        keep their batch rounding."""
        arch = self.model.architecture
        if arch.has_encoder and arch.has_decoder and self.encoder_output is None and not self._encoding:
            raise EncoderError(f"decode of an encoder-decoder model ({self.model.hparams.arch}) needs the "
                               f"encoder's output: call encode first (llama.cpp: llama_encode)")
        status = None if self._encoding else self._decode_one(batch)
        if status is not None:
            return status
        try:
            prepared = self._balloc.init(batch)
        except InvalidBatchError as exc:
            log.error("decode: %s", exc)
            return -1
        ubatches = self._balloc.split(prepared)
        for ub in ubatches:
            ub.per_token = per_token and ub.n_tokens > 1
        self._apply_shifts()  # first, as llama.cpp's memory update: the snapshots below come after it
        snapshots = self._reserve(ubatches) if ubatches else None
        if snapshots is None:
            log.warning("decode: failed to find a memory slot for a batch of %d tokens "
                        "(n_ctx = %d)", len(prepared.pos), self.n_ctx)
            return 1

        hp = self.model.hparams
        n_out_total = int(np.count_nonzero(prepared.output))
        self._n_outputs = 0
        self._output_ids = np.full(len(prepared.pos), -1, np.int32)
        self._logits = None
        self._embd = np.empty((n_out_total, hp.n_embd), np.float32) if self.embeddings else None
        self._embd_seq = {}
        first = 0
        out_row = np.cumsum(prepared.output) - 1   # each output's row, in batch order
        for i, ub in enumerate(ubatches):
            start = time.perf_counter()
            try:
                if i > 0:  # the first ubatch is already placed (_reserve)
                    snapshots = [c.snapshot() for c in self._caches]
                    for ci, cache in enumerate(self._caches):
                        cache.apply(ub.cells[ci], ub.pos, ub.seq_mask)
                self._check_abort()
                plan = self._plan_for(ub)
                plan.run(self._check_abort if self.matmul_observer is None else self._observing(self._plan_key(ub)))
                embd, logits, pooled = plan.results
            except Aborted:
                for cache, snap in zip(self._caches, snapshots):
                    cache.restore(snap)
                log.info("decode: aborted")
                return 2
            n_out = ub.n_outputs
            # an equal split takes tokens out of batch order: outputs go back to it, as llama.cpp's
            rows = first + ub.output_rows if ub.batch_rows is None else ub.batch_rows[ub.output_rows]
            dst = out_row[rows]
            if logits is not None:
                if self._logits is None:
                    self._logits = np.empty((n_out_total, hp.n_vocab), np.float32)
                self._logits[dst] = logits
            if self._embd is not None:
                self._embd[dst] = embd
            if pooled is not None:
                # a sequence pooled again in a later ubatch keeps the later result, as in llama.cpp
                width = hp.n_cls_out if self.pooling_type is PoolingType.RANK else pooled.shape[1]
                for i, s in enumerate(ub.pooling.seq_ids):
                    self._embd_seq[int(s)] = pooled[i, :width].copy()
            self._output_ids[rows] = dst
            self._n_outputs += n_out
            first += ub.n_tokens
            key = "p_eval" if ub.n_tokens > 1 else "eval"
            self._perf[f"t_{key}_ms"] += (time.perf_counter() - start) * 1e3
            self._perf[f"n_{key}"] += ub.n_tokens
        return 0

    def encode(self, batch: Batch) -> int:
        """Run the model's encoder over ``batch`` (llama.cpp's ``llama_encode``): every token
        attends to every token of its sequence (non-causal); the batch must fit in one ubatch.
        Returns 0, 2 (aborted) or -1 (invalid batch).

        An encoder alone (``t5encoder``, and BERT and kin, whose decode is their encode) leaves
        its outputs as :meth:`decode` does (embeddings, pooled as the context says). An
        encoder-decoder model (``t5``) keeps the encoder's final hidden states, with each token's
        position and first sequence, for the decoder's cross-attention in the decodes that follow
        (until the next encode): a decoder token sees the encoded tokens of its own sequence."""
        arch = self.model.architecture
        if not arch.has_encoder and arch.kv_cache:
            raise EncoderError(f"{self.model.hparams.arch} models have no encoder (llama_model_has_encoder "
                               f"is false): run them with decode")
        self._encoding = True
        try:
            if not arch.kv_cache:
                return self.decode(batch)
            return self._encode_for_decoder(batch)
        finally:
            self._encoding = False

    def cross_source(self) -> EncoderOutput:
        """The encoder output the decoder attends over; before any encode (sizing a pass: decode
        refuses to run then), zeros of the training context's rows, as llama.cpp sizes its graph."""
        if self.encoder_output is None:
            return EncoderOutput(self.model.hparams.n_ctx_train, self.model.hparams.n_embd)
        return self.encoder_output

    def _encode_for_decoder(self, batch: Batch) -> int:
        """encode's pass of an encoder-decoder model: its output kept in ``encoder_output``."""
        try:
            prepared = self._enc_balloc.init(batch)
            (ub,) = self._enc_balloc.split(prepared)
        except InvalidBatchError as exc:
            log.error("encode: %s", exc)
            return -1
        start = time.perf_counter()
        try:
            self._check_abort()
            plan = self._plan_for(ub)
            plan.run(self._check_abort)
        except Aborted:
            log.info("encode: aborted")
            return 2
        embd = plan.results[0]                                   # [n_tokens, n_embd]
        out = self.encoder_output
        if out is None or out.embd.shape != embd.shape:
            # the decoder's recorded passes read the encoder output's buffers, sized by its rows
            self._drop_plans()
            out = self.encoder_output = EncoderOutput(embd.shape[0], embd.shape[1])
        out.embd[:] = embd
        out.pos[:] = ub.pos
        out.seq[:] = ub.seq_first
        n = ub.n_tokens
        self._logits, self._embd_seq = None, {}
        self._embd = embd.copy() if self.embeddings else None
        self._n_outputs = n
        self._output_ids = np.arange(n, dtype=np.int32)
        self._perf["t_p_eval_ms"] += (time.perf_counter() - start) * 1e3
        self._perf["n_p_eval"] += n
        return 0

    @property
    def _pools(self) -> bool:
        return self.embeddings and self.pooling_type is not PoolingType.NONE

    def _decode_one(self, batch: Batch) -> int | None:
        """decode of a one-token batch of one sequence (generation's every step) when the step's
        plan is recorded: its checks on Python ints (BatchAllocator.one_token) and its cells
        found and taken by the caches' find_slot and apply as the general path's are, without
        that path's numpy steps (init, split, _reserve and the ubatch loop), which, each run
        cache-cold after the weights streamed through, cost a small model more than a layer.
        Same checks, cells and outputs; None for every other batch (and any invalid one: the
        general path reports it)."""
        one = self._balloc.one_token(batch)
        if one is None:
            return None
        output = one.output
        shape = (1, int(output), False, 0, int(self._balloc.equal_split), False)   # UBatch.shape
        plan = self._plans.get(shape)
        if plan is None:
            return None
        self._apply_shifts()   # as decode does first
        caches = self._caches
        # what an abort or a cache without room puts back (a window's placing also drops the
        # positions that slid out, so one cell's old values would not do)
        snapshots = [cache.snapshot() for cache in caches]
        seq_first = np.full(1, one.seq, np.int32)
        for ci, cache in enumerate(caches):
            cells = cache.find_slot(1, seq_first, np.full(1, 1 << one.seq, np.uint64))
            if cells is None:
                for c, snap in zip(caches, snapshots):
                    c.restore(snap)
                return None
            cache.apply(cells, np.full(1, one.pos, np.int32), np.full(1, 1 << one.seq, np.uint64))
            plan.cells[ci][0], plan.n_kv[ci] = cells[0], cache.used_max_p1
        start = time.perf_counter()
        self._plans.move_to_end(shape)
        self._perf["n_reused"] += 1
        plan.tokens[0], plan.pos[0], plan.seq_first[0] = one.token, one.pos, one.seq
        self._embd, self._embd_seq = None, {}
        try:
            self._check_abort()
            plan.run(self._check_abort if self.matmul_observer is None else self._observing(shape))
        except Aborted:
            for cache, snap in zip(caches, snapshots):
                cache.restore(snap)
            self._logits, self._n_outputs, self._output_ids = None, 0, np.full(1, -1, np.int32)
            log.info("decode: aborted")
            return 2
        logits = plan.results[1]
        self._logits = None if logits is None else logits.copy()   # [n_outputs, n_vocab]
        self._n_outputs = int(output)
        self._output_ids = np.zeros(1, np.int32) if output else np.full(1, -1, np.int32)
        self._perf["t_eval_ms"] += (time.perf_counter() - start) * 1e3
        self._perf["n_eval"] += 1
        return 0

    def _reserve(self, ubatches: list[UBatch]) -> list | None:
        """Find cells for every ubatch, placing them in turn on the caches. None if one does not
        fit (the caches unchanged); else the caches' snapshots from before, with the first ubatch
        left placed (the later ones are taken back: decode places each in its turn)."""
        snapshots = [c.snapshot() for c in self._caches]
        after_first = None
        placed = False
        try:
            for i, ub in enumerate(ubatches):
                for ci, cache in enumerate(self._caches):
                    cells = cache.find_slot(ub.n_tokens, ub.seq_first, ub.seq_mask)
                    if cells is None:
                        return None
                    cache.apply(cells, ub.pos, ub.seq_mask)
                    ub.cells[ci] = cells
                if i == 0 and len(ubatches) > 1:
                    after_first = [c.snapshot() for c in self._caches]
            placed = True
            return snapshots
        finally:
            undo = after_first if placed else snapshots
            for cache, snap in zip(self._caches, undo or ()):
                cache.restore(snap)

    def _record(self, ub: UBatch, arena: Arena,
                observations: dict[int, list[MatmulObservation]] | None = None) -> Plan:
        """Record the forward pass of ubatches shaped like ``ub`` into buffers from ``arena``
        (and its matmul inputs by segment into ``observations``)."""
        hp = self.model.hparams
        plan = Plan(ub.n_tokens, ub.n_outputs, len(self._caches), hp.n_embd if ub.tokens is None else 0,
                    ub.n_seqs, ub.per_token)
        g = Graph(self, ub, plan, arena, encoding=self._encoding)
        embd, logits = self.model.architecture.forward(g)
        pooled = g.pooling(embd, self.pooling_type) if self._pools and ub.pooling is not None else None
        if self.embeddings:   # the dense projections come after pooling, or on every row without it
            if pooled is None:
                embd = g.dense_out(embd)
            else:
                pooled = g.dense_out(pooled)
        plan.results = (embd, logits, pooled)
        if observations is not None:
            observations.update(g.observation_segments())
        return plan

    def _layout(self, ub: UBatch, guarded: bool = False) -> tuple[Arena, Plan]:
        """Record once to learn when each buffer is in use; the arena that packs them (its block
        is allocated but not touched) and the sizing plan."""
        sizing = Arena()
        sized = self._record(ub, sizing)
        return sizing.packed(sized.step_arrays, sized.results, guarded=guarded), sized

    def compute_buffer_size(self, n_tokens: int, n_outputs: int = 1) -> int:
        """Bytes of the activation buffers a ubatch of ``n_tokens`` tokens (``n_outputs`` of them
        producing output) lays out: what its recorded forward pass holds while it is cached."""
        n_tokens = min(n_tokens, self.n_ubatch)
        if not 1 <= n_outputs <= n_tokens:
            raise ValueError(f"n_outputs must be in [1, {n_tokens}], got {n_outputs}")
        ub = UBatch(tokens=np.zeros(n_tokens, np.int32), embd=None, pos=np.arange(n_tokens, dtype=np.int32),
                    seq_first=np.zeros(n_tokens, np.int32), seq_mask=np.ones(n_tokens, np.uint64),
                    output_rows=np.arange(n_tokens - n_outputs, n_tokens, dtype=np.int64))
        if self._pools:
            causal = bool(self._caches) and self.model.hparams.causal_attn
            ub.pooling = pooling_inputs(self.pooling_type, [[0]] * n_tokens, ub.pos, causal)
        arena, _ = self._layout(ub)
        return arena.nbytes

    def _plan_key(self, ub: UBatch) -> tuple:
        """The key of ub's recorded pass: its shape, and for encode's passes, that they are."""
        return ub.shape + ("encode",) if self._encoding else ub.shape

    def _plan_for(self, ub: UBatch) -> Plan:
        """The recorded forward pass for ub's shape (recorded now if new), with ub's inputs in it."""
        key = self._plan_key(ub)
        plan = self._plans.get(key)
        if plan is None:
            # once to learn when each buffer is in use, then into buffers that share memory
            guarded = guard_mode()
            arena, _ = self._layout(ub, guarded)
            observations: dict[int, list[MatmulObservation]] = {}
            plan = self._record(ub, arena, observations)
            if guarded:
                plan.set_guards(*arena.guard_zones())
            self._plans[key] = plan
            self._observations[key] = observations
            if len(self._plans) > _MAX_PLANS:
                evicted, _ = self._plans.popitem(last=False)
                self._observations.pop(evicted, None)
        else:
            self._plans.move_to_end(key)
            self._perf["n_reused"] += 1
        if ub.tokens is not None:
            plan.tokens[:] = ub.tokens
        else:
            plan.embd[:] = ub.embd
        plan.pos[:] = ub.pos
        plan.seq_first[:] = ub.seq_first
        plan.output_rows[:] = ub.output_rows
        if ub.pooling is not None:
            if ub.pooling.mean is not None:
                plan.pool_mean_weights[:] = ub.pooling.mean
            if ub.pooling.rows is not None:
                plan.pool_rows[:] = ub.pooling.rows
        if not self._encoding:   # the encoder of an encoder-decoder model places no cells
            for ci, cache in enumerate(self._caches):
                plan.cells[ci][:] = ub.cells[ci]
                plan.n_kv[ci] = cache.used_max_p1
        return plan

    def _apply_shifts(self) -> None:
        """Re-rotate cached K rows whose positions seq_add/seq_div moved (llama.cpp's K-shift),
        with each layer's RoPE in this context."""
        hp = self.model.hparams

        def rope(rows: np.ndarray, delta: np.ndarray, il: int) -> None:
            if not self.model.architecture.shifts_rope(hp, il):   # llama.cpp's K-shift skips layers without RoPE
                return
            apply_rope(rows, delta, hp.n_head_kv[il], hp, self.rope_config(il), self.n_threads_batch, il)

        self.memory.apply_shifts(rope, self.n_threads_batch)

    # -- outputs

    def _output_row(self, i: int) -> int | None:
        if i < 0:
            j = self._n_outputs + i
            return j if j >= 0 else None
        if i >= len(self._output_ids) or self._output_ids[i] < 0:
            return None
        return int(self._output_ids[i])

    def get_logits_ith(self, i: int) -> np.ndarray | None:
        """Logits of token ``i`` of the last batch (``i < 0``: output rows from the end), or None."""
        j = self._output_row(i)
        return None if j is None or self._logits is None else self._logits[j]

    def get_logits(self) -> np.ndarray | None:
        """All output rows of the last batch, [n_outputs, n_vocab]."""
        return None if self._logits is None else self._logits[: self._n_outputs]

    def get_embeddings_ith(self, i: int) -> np.ndarray | None:
        j = self._output_row(i)
        return None if j is None or self._embd is None else self._embd[j]

    def get_embeddings(self) -> np.ndarray | None:
        return None if self._embd is None else self._embd[: self._n_outputs]

    def get_embeddings_seq(self, seq_id: int) -> np.ndarray | None:
        """The pooled embedding of ``seq_id`` in the last batch ([n_embd], or the rank pooling's
        [n_cls_out] scores), or None."""
        return self._embd_seq.get(seq_id)

    @property
    def n_outputs(self) -> int:
        return self._n_outputs

    # -- state

    def _model_id(self) -> list[str]:
        hp = self.model.hparams
        return [hp.arch, str(hp.n_layer), str(hp.n_embd), str(hp.n_vocab)]

    def _state_bytes(self, kind: str, arrays: dict[str, np.ndarray], path: str | PathLike[str] | None,
                     tokens: Sequence[int] | None) -> bytes:
        arrays = {"magic": np.array(kind), "model": np.array(self._model_id()),
                  "n_caches": np.array([len(self._caches)]),
                  "tokens": np.asarray(list(tokens or ()), dtype=np.int32), **arrays}
        data = kv_cache.save_arrays(arrays)
        if path is not None:
            Path(path).write_bytes(data)
        return data

    def _state_arrays(self, kind: str, source: bytes | str | PathLike[str]) -> dict[str, np.ndarray]:
        """A saved state's arrays, checked to be ``kind`` for this model and cache layout."""
        try:
            data = source if isinstance(source, (bytes, bytearray)) else Path(source).read_bytes()
        except OSError as exc:
            raise StateError(f"cannot read the state file: {exc}") from None
        arrays = kv_cache.load_arrays(bytes(data))
        try:
            if str(arrays["magic"]) != kind:
                raise StateError(f"not a gguflm {kind.split('-v')[0].replace('-', ' ')} "
                                 f"(magic {str(arrays['magic'])!r})")
            if list(arrays["model"]) != self._model_id():
                raise StateError(f"the state was saved for model {list(arrays['model'])}, this is "
                                 f"{self._model_id()}")
            if int(arrays["n_caches"][0]) != len(self._caches):
                raise StateError("the state has a different cache layout")
            if arrays["tokens"].dtype != np.int32 or arrays["tokens"].ndim != 1:
                raise StateError("the state's token list is malformed")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise StateError(f"the state lacks {exc}") from None
        return arrays

    def state_save(self, path: str | PathLike[str] | None = None, tokens: Sequence[int] | None = None) -> bytes:
        """The whole memory and the last outputs as bytes, and ``tokens`` with them (llama.cpp's
        ``llama_state_get_data``, or ``llama_state_save_file`` with ``path``: also written there)."""
        self._apply_shifts()
        arrays: dict[str, np.ndarray] = {
            "output_ids": self._output_ids,
            "n_outputs": np.array([self._n_outputs]),
            "logits": self._logits[: self._n_outputs] if self._logits is not None else np.zeros((0, 0), np.float32),
        }
        if self._embd is not None:
            arrays["embd"] = self._embd[: self._n_outputs]
        for ci, cache in enumerate(self._caches):
            arrays.update(cache.state_arrays(f"c{ci}_"))
        return self._state_bytes(STATE_MAGIC, arrays, path, tokens)

    def state_load(self, source: bytes | str | PathLike[str]) -> list[int]:
        """Restore what :meth:`state_save` wrote (bytes or a file); returns the tokens saved with
        it. A state of another model or cache layout, or a truncated or corrupt one, raises
        :class:`gguflm.errors.StateError` and leaves the context as it was. As llama.cpp's, the
        cells come back from each region's first cell on."""
        arrays = self._state_arrays(STATE_MAGIC, source)
        try:
            saved = [cache.saved_cells(f"c{ci}_", arrays) for ci, cache in enumerate(self._caches)]
            output_ids = arrays["output_ids"].astype(np.int32)
            n_outputs = int(arrays["n_outputs"][0])
            logits = arrays["logits"].astype(np.float32)
            embd = arrays["embd"].astype(np.float32) if "embd" in arrays else None
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise StateError(f"the state lacks {exc}") from None
        if n_outputs < 0 or (logits.size and logits.shape[0] < n_outputs):
            raise StateError("the state's outputs are malformed")
        for cache, cells in zip(self._caches, saved):
            cache.restore_cells(cells)
        self._output_ids, self._n_outputs = output_ids, n_outputs
        self._logits = logits if logits.size else None
        self._embd = embd
        return arrays["tokens"].tolist()

    def state_seq_save(self, seq_id: int, path: str | PathLike[str] | None = None,
                       tokens: Sequence[int] | None = None) -> bytes:
        """Sequence ``seq_id``'s memory as bytes, and ``tokens`` with it (llama.cpp's
        ``llama_state_seq_get_data``, or ``llama_state_seq_save_file`` with ``path``)."""
        if not 0 <= seq_id < self.n_seq_max:
            raise ValueError(f"sequence id {seq_id} out of range [0, {self.n_seq_max})")
        self._apply_shifts()
        arrays: dict[str, np.ndarray] = {}
        for ci, cache in enumerate(self._caches):
            arrays.update(cache.state_arrays(f"c{ci}_", seq_id))
        return self._state_bytes(SEQ_STATE_MAGIC, arrays, path, tokens)

    def state_seq_load(self, source: bytes | str | PathLike[str], dest_seq_id: int) -> list[int]:
        """Put what :meth:`state_seq_save` wrote into sequence ``dest_seq_id`` (its old cells
        freed first, the new ones found as for a batch); returns the tokens saved with it. A bad
        state, or no room, raises :class:`gguflm.errors.StateError` and leaves the context as it
        was."""
        if not 0 <= dest_seq_id < self.n_seq_max:
            raise ValueError(f"sequence id {dest_seq_id} out of range [0, {self.n_seq_max})")
        arrays = self._state_arrays(SEQ_STATE_MAGIC, source)
        saved = [cache.saved_cells(f"c{ci}_", arrays) for ci, cache in enumerate(self._caches)]
        snapshots = [cache.snapshot() for cache in self._caches]
        for ci, (cache, cells) in enumerate(zip(self._caches, saved)):
            if not cache.restore_sequence(cells, dest_seq_id):
                for done, snap in zip(self._caches[:ci], snapshots):
                    done.restore(snap)
                raise StateError(f"no room in the KV cache for the {len(cells.pos)} cells of the saved sequence")
        return arrays["tokens"].tolist()

    # -- performance

    def perf(self) -> dict[str, float]:
        """llama.cpp's ``llama_perf_context``: times in ms, token counts, graph reuses."""
        return {"t_load_ms": self.t_load_ms, **self._perf}

    def perf_reset(self) -> None:
        for key in self._perf:
            self._perf[key] = 0.0 if key.startswith("t_") else 0

    # -- lifetime

    def close(self) -> None:
        self._caches = []
        self._plans.clear()
        self._observations.clear()
        self._logits = self._embd = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
