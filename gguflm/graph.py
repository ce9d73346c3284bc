"""The building blocks every architecture's forward pass chains: one :class:`Graph` per ubatch.

A Graph holds the ubatch (tokens, positions, sequences, cache cells, output rows), the thread
count chosen for it, and an :class:`Arena` of activation buffers. Buffers are handed out in call
order; when the next ubatch has the same shape, the forward pass makes the same calls in the same
order and gets the same buffers back, allocated once (llama.cpp's graph reuse).

Numerics are ggml's: every matmul quantizes its input to the weight type's dot partner
(activations shared between matmuls of the same input and partner type, as the result is the
same), norms, RoPE, attention and GLUs come from ``gguflm._ext.ops``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gguflm._ext import ops, quants
from gguflm.ggml_types import GGMLType
from gguflm.hparams import RopeType

if TYPE_CHECKING:
    from gguflm.loader import Weight
    from gguflm.model import Layer, Model


class Aborted(Exception):
    """The context's abort callback asked to stop (caught by decode)."""


@dataclass
class UBatch:
    """One ubatch, as the forward pass sees it."""

    tokens: np.ndarray | None            # int32 [n_tokens] (None when embeddings are given)
    embd: np.ndarray | None              # float32 [n_tokens, n_embd]
    pos: np.ndarray                      # int32 [n_tokens]
    seq_first: np.ndarray                # int32 [n_tokens]: the token's first sequence (masks)
    seq_mask: np.ndarray                 # uint64 [n_tokens]: all its sequences (cache cells)
    output_rows: np.ndarray              # int64 [n_outputs]: rows that produce output
    cells: dict[int, np.ndarray] = field(default_factory=dict)  # cache index → cells

    @property
    def n_tokens(self) -> int:
        return len(self.pos)

    @property
    def n_outputs(self) -> int:
        return len(self.output_rows)


class Arena:
    """Activation buffers reused across ubatches of one shape, handed out in call order."""

    def __init__(self) -> None:
        self.buffers: list[np.ndarray] = []
        self.next = 0

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        if self.next < len(self.buffers):
            buf = self.buffers[self.next]
            if buf.shape != shape or buf.dtype != dtype:
                buf = self.buffers[self.next] = np.empty(shape, dtype)
        else:
            buf = np.empty(shape, dtype)
            self.buffers.append(buf)
        self.next += 1
        return buf


@dataclass(frozen=True)
class RopeConfig:
    """The effective RoPE parameters of one layer in this context."""

    freq_base: float
    freq_scale: float
    ext_factor: float
    attn_factor: float
    beta_fast: float
    beta_slow: float
    n_ctx_orig: int
    freq_factors: np.ndarray | None    # per-pair divisors of theta (Llama 3.1, Phi 3 long/short)


def apply_rope(x: np.ndarray, pos: np.ndarray, n_head: int, hp: Any, rc: RopeConfig,
               n_threads: int) -> None:
    """Rotate the heads of x ([n_rows, n_head * head_dim]) in place by ``pos`` (one per row)."""
    ops.rope(x, pos, n_head, hp.n_embd_head_k, hp.n_rot, hp.rope_type is RopeType.NEOX,
             rc.freq_base, rc.freq_scale, rc.ext_factor, rc.attn_factor, rc.beta_fast, rc.beta_slow,
             rc.n_ctx_orig, rc.freq_factors, n_threads)


class Graph:
    """The forward pass of one ubatch through ``ctx``'s model."""

    def __init__(self, ctx: Any, ub: UBatch, arena: Arena):
        self.ctx = ctx
        self.model: Model = ctx.model
        self.hparams = ctx.model.hparams
        self.ub = ub
        self.arena = arena
        arena.next = 0
        # llama.cpp's one selection point: batches use the batch threads, single tokens the others
        self.n_threads = ctx.n_threads_batch if ub.n_tokens > 1 else ctx.n_threads

    # -- buffers

    def new(self, *shape: int, dtype: Any = np.float32) -> np.ndarray:
        return self.arena.take(tuple(shape), np.dtype(dtype))

    # -- layers, with the abort check between them

    def layers(self) -> Iterator[tuple[int, Layer]]:
        for il, layer in enumerate(self.model.layers):
            self.ctx._check_abort()
            yield il, layer

    # -- embeddings

    def embed(self, w: Weight, scale: float = 0.0) -> np.ndarray:
        """Rows of the embedding matrix for the ubatch's tokens (or its given embeddings)."""
        n_embd = self.hparams.n_embd
        x = self.new(self.ub.n_tokens, n_embd)
        if self.ub.tokens is None:
            x[:] = self.ub.embd
        else:
            quants.get_rows(int(w.type), w.data.view(np.uint8), n_embd, self.ub.tokens, x)
        if scale:
            np.multiply(x, np.float32(scale), out=x)
        return x

    # -- norms and elementwise

    def rms_norm(self, x: np.ndarray, w: Weight | None, eps: float | None = None) -> np.ndarray:
        out = self.new(*x.shape)
        ops.rms_norm(x, None if w is None else w.data, self.hparams.f_norm_rms_eps if eps is None else eps,
                     out, self._threads_for(x.shape[0]))
        return out

    def rms_norm_heads(self, x: np.ndarray, w: Weight | None) -> np.ndarray:
        """RMS norm of every head's slice of every row, in place (Gemma 3 / Qwen 3 QK-norm);
        nothing when the model has no such norm (``w`` is None)."""
        if w is None:
            return x
        rows = x.reshape(-1, w.shape[0])
        ops.rms_norm(rows, w.data, self.hparams.f_norm_rms_eps, rows, self._threads_for(x.shape[0]))
        return x

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """x += y (residual), in place."""
        np.add(x, y, out=x)
        return x

    def add_bias(self, x: np.ndarray, b: Weight | None) -> np.ndarray:
        if b is not None:
            np.add(x, b.data, out=x)
        return x

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        np.multiply(x, np.float32(s), out=x)
        return x

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        out = self.new(*gate.shape)
        ops.swiglu(gate, up, out, self._threads_for(gate.shape[0]))
        return out

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        out = self.new(*gate.shape)
        ops.geglu(gate, up, out, self._threads_for(gate.shape[0]))
        return out

    # -- matmul

    def project(self, x: np.ndarray, *weights: Weight) -> tuple[np.ndarray, ...]:
        """x @ W.T for each weight; x is quantized once per partner type among them (the result
        equals ggml's, which quantizes again for every matmul)."""
        if self.ub.n_tokens > 1:  # long prompts: let a cancel land between matmuls, not only layers
            self.ctx._check_abort()
        quantized: dict[int, np.ndarray] = {}
        outs = []
        for w in weights:
            partner = quants.type_traits(int(w.type))["vec_dot_type"]
            xq = quantized.get(partner)
            if xq is None:
                xq = quantized[partner] = self.new(x.shape[0], quants.row_bytes(partner, x.shape[1]),
                                                   dtype=np.uint8)
                quants.quantize_act(partner, x, xq, self.n_threads)
            out = self.new(x.shape[0], w.data.shape[0])
            quants.matmul_quantized(int(w.type), w.data.view(np.uint8), x.shape[1], xq, out,
                                    self.n_threads)
            outs.append(out)
        return tuple(outs)

    def split(self, x: np.ndarray, *widths: int) -> tuple[np.ndarray, ...]:
        """Cut the columns of x into contiguous pieces of the given widths (fused projections)."""
        if sum(widths) != x.shape[1]:
            raise ValueError(f"widths {widths} do not add up to {x.shape[1]} columns")
        outs, start = [], 0
        for width in widths:
            out = self.new(x.shape[0], width)
            out[:] = x[:, start:start + width]
            outs.append(out)
            start += width
        return tuple(outs)

    def linear(self, x: np.ndarray, w: Weight, b: Weight | None = None) -> np.ndarray:
        return self.add_bias(self.project(x, w)[0], b)

    # -- attention

    def rope_config(self, il: int) -> RopeConfig:
        return self.ctx.rope_config(il)

    def rope(self, x: np.ndarray, il: int, n_head: int) -> np.ndarray:
        """Rotate x ([n_tokens, n_head * head_dim]) in place by the ubatch positions."""
        hp = self.hparams
        if hp.rope_type is RopeType.NONE:
            return x
        apply_rope(x, self.ub.pos, n_head, hp, self.rope_config(il), self._threads_for(x.shape[0]))
        return x

    def attention(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  kq_scale: float) -> np.ndarray:
        """Store k, v in the layer's cache cells, then attend q over the cache."""
        hp = self.hparams
        cache_index, cache = self.ctx.cache_for_layer(il)
        cells = self.ub.cells[cache_index]
        cache.k[il].write(cells, k)
        cache.v[il].write(cells, v)
        out = self.new(self.ub.n_tokens, hp.n_head[il] * hp.n_embd_head_v)
        ops.attention(q, cache.k[il].data, cache.k[il].cache_type, cache.v[il].data,
                      cache.v[il].cache_type, cache.used_max_p1, cache.pos, cache.seq,
                      self.ub.pos, self.ub.seq_first, hp.n_head[il], hp.n_head_kv[il],
                      hp.n_embd_head_k, hp.n_embd_head_v, kq_scale, out, causal=hp.causal_attn,
                      n_swa=hp.n_swa if hp.is_swa(il) else 0, softcap=hp.f_attn_logit_softcapping,
                      n_threads=self.n_threads)
        return out

    # -- outputs

    def output_rows(self, *xs: np.ndarray) -> tuple[np.ndarray, ...]:
        """Keep only the rows that produce output (llama.cpp's inp_out_ids before the last layer)."""
        rows = self.ub.output_rows
        if len(rows) == self.ub.n_tokens:
            return xs
        outs = []
        for x in xs:
            out = self.new(len(rows), x.shape[1])
            np.take(x, rows, axis=0, out=out)
            outs.append(out)
        return tuple(outs)

    def logits(self, x: np.ndarray, w: Weight) -> np.ndarray:
        (out,) = self.project(x, w)
        cap = self.hparams.f_final_logit_softcapping
        if cap:
            np.multiply(out, np.float32(1.0 / cap), out=out)
            np.tanh(out, out=out)
            np.multiply(out, np.float32(cap), out=out)
        return out

    def _threads_for(self, n_rows: int) -> int:
        # row-wise ops on a single token are too small to be worth waking a second thread
        return self.n_threads if n_rows > 1 else 1
