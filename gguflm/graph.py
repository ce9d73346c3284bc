"""The building blocks every architecture's forward pass chains: one :class:`Graph` per ubatch shape.

A Graph records the forward pass instead of computing it: every building block appends one or
more nodes (kernel calls on raw buffers) to a :class:`~gguflm._ext.plan.Plan` and returns the
buffers its results will be in. The context then runs the plan with the GIL released, and replays
it for every later ubatch of the same shape after filling in that ubatch's tokens, positions and
cache cells (llama.cpp's graph reuse). Buffers come from an :class:`Arena` owned with the plan.

Numerics are ggml's: every matmul quantizes its input to the weight type's dot partner
(activations shared between matmuls of the same input and partner type, as the result is the
same), norms, RoPE, attention and GLUs come from ``src/ops.h``.

The context's LoRA adapters (:mod:`gguflm.lora`) join every matmul of a weight they adapt and the
token embedding's lookup, and its control vector (:mod:`gguflm.control_vector`) the output of
every layer, here, as llama.cpp's ``build_lora_mm``, ``build_inp_embd`` and ``build_cvec`` do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gguflm._ext import ops, quants, wkv
from gguflm._ext.plan import ALTUP_KINDS, ALTUP_N, MAX_GROUP, Plan
from gguflm.batch import UBatch
from gguflm.errors import ModelLoadError
from gguflm.ggml_types import GGMLType
from gguflm.hparams import RopeType
from gguflm.pooling import PoolingType
from gguflm.quants import matmul_storage
from gguflm.rope import RopeParams

if TYPE_CHECKING:
    from gguflm.loader import Weight
    from gguflm.lora import LoraPair
    from gguflm.model import Layer

GLU_SWIGLU, GLU_GEGLU, GLU_REGLU = 0, 1, 2
UNARY_GELU, UNARY_TANH, UNARY_RELU_SQR = 0, 1, 2
# llama.cpp's llama_expert_gating_func_type: probabilities before top-k (softmax, sigmoid) or a
# softmax over the selected experts' logits after it (gpt-oss)
GATING_SOFTMAX, GATING_SIGMOID, GATING_SOFTMAX_WEIGHT = 1, 2, 3


class Aborted(Exception):
    """The context's abort callback asked to stop (caught by decode)."""


_ALIGN = 64  # bytes: every buffer starts on a cache line


class Arena:
    """The activation buffers of one plan.

    A forward pass is recorded twice. In the first recording every buffer gets memory of its own
    (``np.empty``, never touched, so nothing becomes resident) and the nodes show when each buffer
    is first used and last used. :meth:`packed` then lays the buffers out in one block where those
    whose lifetimes do not overlap share bytes (ggml-alloc's reuse); the second recording takes its
    buffers from that layout, in the same order. Without the reuse a 512-token ubatch of a small
    model would hold every layer's intermediates at once: hundreds of MB.
    """

    def __init__(self, offsets: list[int] | None = None, size: int = 0,
                 lifetimes: list[tuple[int, int]] | None = None) -> None:
        self.buffers: list[np.ndarray] = []
        self._offsets = offsets
        self._lifetimes = lifetimes   # guard mode: each buffer's first and last step
        self._block: np.ndarray | None = None
        if offsets is not None:
            raw = np.empty(size + _ALIGN, np.uint8)
            skip = -raw.ctypes.data % _ALIGN
            self._block = raw[skip:skip + size]

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        if self._block is None:
            buf = np.empty(shape, dtype)
        else:
            i = len(self.buffers)
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            if i >= len(self._offsets) or self._offsets[i] + nbytes > len(self._block):
                raise RuntimeError("the forward pass asked for other buffers than when it was laid out")
            buf = self._block[self._offsets[i]:self._offsets[i] + nbytes].view(dtype).reshape(shape)
        self.buffers.append(buf)
        return buf

    @property
    def nbytes(self) -> int:
        return len(self._block) if self._block is not None else sum(b.nbytes for b in self.buffers)

    def packed(self, step_arrays: Sequence[tuple[Any, ...]], results: Any, guarded: bool = False) -> Arena:
        """An arena laying out this one's buffers (in the order they were taken) in one block,
        given the arrays of each step the plan executes (``Plan.step_arrays``: matmuls grouped
        into one parallel region are one step, since they run at the same time); buffers in
        ``results`` stay alive to the end. ``guarded``: every buffer gets a guard zone of
        ``_ALIGN`` bytes on each side (and its alignment padding), see :meth:`guard_zones`."""
        owner = {id(b): i for i, b in enumerate(self.buffers)}
        end = len(step_arrays)
        first, last = [end] * len(self.buffers), [-1] * len(self.buffers)

        def touch(a: Any, k: int) -> None:
            # views (reshapes, byte views) name the buffer they came from as their base
            i = owner.get(id(a if a.base is None else a.base)) if isinstance(a, np.ndarray) else None
            if i is not None:
                first[i], last[i] = min(first[i], k), max(last[i], k)

        for k, arrays in enumerate(step_arrays):
            for a in arrays:
                touch(a, k)
        for a in _arrays_in(results):
            touch(a, end)
        offsets, size = [0] * len(self.buffers), 0
        live: list[tuple[int, int, int]] = []  # (offset, stop, last use) of buffers placed so far
        for i in sorted(range(len(self.buffers)), key=lambda i: (first[i], i)):
            live = sorted(b for b in live if b[2] >= first[i])  # the others are dead by now
            guard = _ALIGN if guarded else 0
            need = -(-self.buffers[i].nbytes // _ALIGN) * _ALIGN + 2 * guard
            at = 0
            for start, stop, _ in live:  # first gap wide enough
                if at + need <= start:
                    break
                at = max(at, stop)
            offsets[i] = at + guard
            live.append((at, at + need, max(last[i], first[i])))
            size = max(size, at + need)
        lifetimes = [(min(f, end - 1), min(max(l, f), end - 1)) for f, l in zip(first, last)]
        return Arena(offsets, size, lifetimes if guarded else None)

    def guard_zones(self) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
        """Guard mode: the zones before and after every buffer (addresses, lengths) and the
        first and last step each is in use, as :meth:`gguflm._ext.plan.Plan.set_guards` takes
        them. Call once the plan that uses this arena is recorded."""
        if self._lifetimes is None:
            raise ValueError("not a guarded arena")
        at, length, first, last = [], [], [], []
        base = self._block.ctypes.data
        # from the layout, not the buffers: numpy may give an empty view a pointer of its own
        for buf, offset, (f, l) in zip(self.buffers, self._offsets, self._lifetimes):
            start, stop = base + offset, base + offset + buf.nbytes
            after = -(-buf.nbytes // _ALIGN) * _ALIGN - buf.nbytes + _ALIGN
            at += [start - _ALIGN, stop]
            length += [_ALIGN, after]
            first += [f, f]
            last += [l, l]
        return np.array(at, np.int64), np.array(length, np.int64), first, last


def _file_layout(w: Weight) -> None:
    """Rows read one by one (get_rows) need the file's layout; the loader keeps it for them."""
    if w.rows16:
        raise ValueError(f"tensor '{w.name}' is held in the rows-16 layout, which only matmuls read")


def _f32(*weights: Weight) -> None:
    """The state-space kernels read F32 parameters only, as ggml's do."""
    for w in weights:
        if w.type != GGMLType.F32:
            raise ModelLoadError(f"tensor '{w.name}' is {w.type.name}; the state-space kernels take F32 only")


def _arrays_in(value: Any) -> Iterator[np.ndarray]:
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _arrays_in(v)


def apply_rope(x: np.ndarray, pos: np.ndarray, n_head: int, hp: Any, rc: RopeParams,
               n_threads: int, il: int = 0) -> None:
    """Rotate the K heads of layer ``il`` in x ([n_rows, n_head * head_dim]) in place by ``pos``
    (one per row): the n_rot values of each from ``hp.k_rope_offset`` on."""
    at, n_rot = hp.k_rope_offset, hp.rot(il)
    part = x if not at else np.ascontiguousarray(x.reshape(len(x), n_head, -1)[:, :, at:at + n_rot]).reshape(len(x), -1)
    ops.rope(part, pos, n_head, hp.head_k(il) - at, n_rot, hp.rope_type is RopeType.NEOX,
             rc.freq_base, rc.freq_scale, rc.ext_factor, rc.attn_factor, rc.beta_fast, rc.beta_slow,
             rc.n_ctx_orig, rc.freq_factors, n_threads)
    if at:
        x.reshape(len(x), n_head, -1)[:, :, at:at + n_rot] = part.reshape(len(x), n_head, -1)


@dataclass(frozen=True)
class MatmulObservation:
    """The input ``x`` of the matmuls of ``names``, complete at boundary node ``node``; for
    expert weights the routing (ids [n, k], weights, offsets [n_expert + 1], ...) and whether the
    rows of x are already one per (token, slot) in expert order (``by_expert``) or one per token."""

    node: int
    x: np.ndarray
    names: tuple[str, ...]
    route: tuple[np.ndarray, ...] | None = None
    by_expert: bool = False


class Graph:
    """Records the forward pass of ubatches shaped like ``ub`` through ``ctx``'s model."""

    def __init__(self, ctx: Any, ub: UBatch, plan: Plan, arena: Arena, encoding: bool = False):
        self.ctx = ctx
        # the encoder's pass of an encoder-decoder model (llama_encode): attention without a cache
        self.encoding = encoding
        self.model = ctx.model
        self.hparams = ctx.model.hparams
        self.ub = ub
        self.plan = plan
        self.arena = arena
        # llama.cpp's one selection point: batches use the batch threads, single tokens the others
        self.n_threads = ctx.n_threads_batch if ub.n_tokens > 1 else ctx.n_threads
        # segment boundaries recorded (node indices) and, at the boundary before each projection of
        # a multi-token ubatch, its input: what Context.observe_matmuls hands to an observer
        self.boundaries: list[int] = []
        self.observations: list[MatmulObservation] = []
        # the result of the last residual add: a layer's output, where its control vector goes
        self._last_add: np.ndarray | None = None

    # -- buffers

    def new(self, *shape: int, dtype: Any = np.float32) -> np.ndarray:
        return self.arena.take(tuple(shape), np.dtype(dtype))

    # -- layers, with a segment boundary (abort check) before each

    def layers(self) -> Iterator[tuple[int, Layer]]:
        """The blocks in order; after each, its control vector joins its output (the result of
        the block's last residual add, llama.cpp's ``l_out``), where the architecture has one."""
        for il, layer in enumerate(self.model.layers):
            self.boundary()
            self._last_add = None
            yield il, layer
            direction = self.ctx.cvec.direction(il)
            if direction is not None and self.model.architecture.control_vector:
                if self._last_add is None:
                    raise RuntimeError(f"block {il} ended without a residual add to add its control vector to")
                self.plan.add_row(self._last_add, direction)

    def boundary(self) -> None:
        """End the running segment: decode may stop here (abort) and observers look here."""
        self.plan.layer()
        self.boundaries.append(self.plan.size - 1)

    def observe(self, x: np.ndarray, weights: Sequence[Weight], route: tuple[np.ndarray, ...] | None = None,
                by_expert: bool = False) -> None:
        """Note x as the input of these weights' matmuls, readable at the boundary just recorded."""
        self.observations.append(MatmulObservation(self.boundaries[-1], x, tuple(w.name for w in weights),
                                                   route, by_expert))

    def observation_segments(self) -> dict[int, list[MatmulObservation]]:
        """The observations by the segment before which they are complete (the order in which
        Plan.run calls its check_abort): a boundary node ends a segment unless it opens one."""
        segment_of, start, index = {}, 0, 0
        for node in self.boundaries:
            if node > start:
                start, index = node + 1, index + 1
            segment_of[node] = index
        by_segment: dict[int, list[MatmulObservation]] = {}
        for ob in self.observations:
            by_segment.setdefault(segment_of[ob.node], []).append(ob)
        return by_segment

    # -- embeddings

    def embed(self, w: Weight, scale: float = 0.0) -> np.ndarray:
        """Rows of the embedding matrix for the ubatch's tokens (or its given embeddings)."""
        _file_layout(w)
        x = self.new(self.ub.n_tokens, self.hparams.n_embd)
        if self.ub.tokens is None:
            self.plan.copy(self.plan.embd, 0, x)
        else:
            self.plan.get_rows(int(w.kernel_type), w.data.view(np.uint8), w.shape[0], x)
            for pair, s in self.loras(w):  # B · (rows of A), A looked up by token as the embedding
                rows = self.new(self.ub.n_tokens, pair.rank)
                self.plan.get_rows(int(pair.a.kernel_type), pair.a.data.view(np.uint8), pair.rank, rows)
                self._add_scaled(x, self._lora_matmuls([pair.b], rows, {})[0], s)
        if scale:
            self.plan.scale(x, scale)
        return x

    def token_rows(self, w: Weight) -> np.ndarray:
        """Rows of ``w`` ([n_vocab][width], any width) for the ubatch's tokens (Gemma 4's per-layer
        token embeddings)."""
        _file_layout(w)
        x = self.new(self.ub.n_tokens, w.shape[0])
        self.plan.get_rows(int(w.kernel_type), w.data.view(np.uint8), w.shape[0], x)
        return x

    def position_rows(self, w: Weight) -> np.ndarray:
        """Rows of ``w`` at the ubatch's positions (absolute position embeddings)."""
        _file_layout(w)
        x = self.new(self.ub.n_tokens, w.shape[0])
        self.plan.get_rows(int(w.kernel_type), w.data.view(np.uint8), w.shape[0], x, by_position=True)
        return x

    # -- norms and elementwise

    def rms_norm(self, x: np.ndarray, w: Weight | None, eps: float | None = None) -> np.ndarray:
        out = self.new(*x.shape)
        self.plan.rms_norm(x, None if w is None else w.data,
                           self.hparams.f_norm_rms_eps if eps is None else eps, out, self.n_threads)
        return out

    def rms_norm_groups(self, x: np.ndarray, w: Weight, group: int) -> np.ndarray:
        """RMS norm of every ``group`` values of each row, then times w (the whole row's weights),
        as ggml_rms_norm of the reshaped rows then ggml_mul (Mamba-2's grouped norm)."""
        out = self.new(*x.shape)
        rows = out.reshape(-1, group)
        self.plan.rms_norm(x.reshape(-1, group), None, self.hparams.f_norm_rms_eps, rows, self.n_threads)
        self.plan.mul_row(out, w.data.reshape(-1))
        return out

    def rms_norm_heads(self, x: np.ndarray, w: Weight | None) -> np.ndarray:
        """RMS norm of every head's slice of every row, in place (Gemma 3 / Qwen 3 QK-norm);
        nothing when the model has no such norm (``w`` is None)."""
        if w is not None:
            rows = x.reshape(-1, w.shape[0])
            self.plan.rms_norm(rows, w.data, self.hparams.f_norm_rms_eps, rows, self.n_threads)
        return x

    def layer_norm(self, x: np.ndarray, w: Weight | None, b: Weight | None, eps: float | None = None) -> np.ndarray:
        """LayerNorm (ggml_norm, then * w, then + b; either may be None)."""
        out = self.new(*x.shape)
        self.plan.layer_norm(x, None if w is None else w.data, None if b is None else b.data,
                             self.hparams.f_norm_eps if eps is None else eps, out, self.n_threads)
        return out

    def layer_norm_heads(self, x: np.ndarray, w: Weight | None, head_dim: int) -> np.ndarray:
        """LayerNorm of every head's slice of every row, then times w (one row of weights per
        head: [n_head * head_dim]), as ggml_norm of the 3-D heads then ggml_mul (StableLM 2's
        Q/K norms); x itself when w is None."""
        if w is None:
            return x
        rows = x.reshape(-1, head_dim)
        out = self.new(*rows.shape)
        self.plan.layer_norm(rows, None, None, self.hparams.f_norm_eps, out, self.n_threads)
        out = out.reshape(x.shape)
        self.plan.mul_row(out, w.data.reshape(-1))
        return out

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """x += y (residual), in place."""
        self.plan.add(x, y)
        self._last_add = x
        return x

    def add_matrix_row(self, x: np.ndarray, w: Weight, row: int, scale: float = 0.0) -> np.ndarray:
        """x[i] += row ``row`` of the matrix w (times ``scale`` unless 0), for every i (BERT's
        token-type embedding), in place."""
        _file_layout(w)
        values = np.empty(w.shape[0], np.float32)
        quants.dequantize(int(w.kernel_type), np.ascontiguousarray(w.data[row:row + 1].view(np.uint8)), values[None, :])
        if scale:
            values *= np.float32(scale)
        self.plan.add_row(x, values)
        return x

    def add_bias(self, x: np.ndarray, b: Weight | None) -> np.ndarray:
        if b is not None:
            self.plan.add_row(x, b.data)
        return x

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        self.plan.scale(x, s)
        return x

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        out = self.new(*gate.shape)
        self.plan.glu(GLU_SWIGLU, gate, up, out, self.n_threads)
        return out

    def glu(self, kind: int, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """act(gate) * up, act by ``kind`` (GLU_SWIGLU, GLU_GEGLU, GLU_REGLU)."""
        out = self.new(*gate.shape)
        self.plan.glu(kind, gate, up, out, self.n_threads)
        return out

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        out = self.new(*gate.shape)
        self.plan.glu(GLU_GEGLU, gate, up, out, self.n_threads)
        return out

    def gelu(self, x: np.ndarray) -> np.ndarray:
        """GELU through ggml's fp16 table, as ggml_gelu on float rows."""
        out = self.new(*x.shape)
        self.plan.unary(UNARY_GELU, x, out, self.n_threads)
        return out

    def tanh(self, x: np.ndarray) -> np.ndarray:
        out = self.new(*x.shape)
        self.plan.unary(UNARY_TANH, x, out, self.n_threads)
        return out

    # -- matmul

    def project(self, x: np.ndarray, *weights: Weight) -> tuple[np.ndarray, ...]:
        """x @ W.T for each weight, plus the context's LoRA corrections of it; x is quantized
        once per partner type among them (the result equals ggml's, which quantizes again for
        every matmul)."""
        if self.ub.n_tokens > 1:  # long prompts: let a cancel land between matmuls, not only layers
            self.boundary()
            self.observe(x, weights)
        quantized: dict[int, np.ndarray] = {}
        xqs = [self._quantized(x, w, quantized) for w in weights]
        outs = []
        for w, xq in zip(weights, xqs):
            out = self.new(x.shape[0], w.data.shape[0])
            # llama.cpp repacks every matmul weight, a tied output projection too: it loads the
            # token embedding a second time as the output layer's tensor (TENSOR_DUPLICATED, in
            # the output layer's buffer type), which the repack buffer holds like any matmul weight
            self.plan.matmul(int(w.kernel_type), w.data.view(np.uint8), x.shape[1], xq, out,
                             matmul_storage(w.kernel_type, rows16=w.rows16), self.n_threads)
            outs.append(out)
        if len(weights) > 1:  # one parallel region: no barrier between the projections
            self.plan.group_matmuls(len(weights))
        loras = [(out, pair, s) for w, out in zip(weights, outs) for pair, s in self.loras(w)]
        if loras:  # the A·x of every correction in one parallel region, then each B·(A·x)
            a_xs = self._lora_matmuls([pair.a for _, pair, _ in loras], x, quantized)
            for (out, pair, s), a_x in zip(loras, a_xs):
                self._add_scaled(out, self._lora_matmuls([pair.b], a_x, {})[0], s)
        return tuple(outs)

    def _quantized(self, x: np.ndarray, w: Weight, quantized: dict[int, np.ndarray]) -> np.ndarray:
        """x in w's dot partner type, quantized once per partner (``quantized`` holds those made)."""
        partner = quants.type_traits(int(w.kernel_type))["vec_dot_type"]
        if partner not in quantized:
            quantized[partner] = self.new(x.shape[0], quants.row_bytes(partner, x.shape[1]), dtype=np.uint8)
            self.plan.quantize(partner, x, quantized[partner], self.n_threads)
        return quantized[partner]

    # -- adapters

    def loras(self, w: Weight) -> list[tuple[LoraPair, float]]:
        """The context's LoRA pairs of ``w`` and their scales, in llama.cpp's order."""
        return [(pair, pair.scale(adapter.alpha, scale)) for adapter, scale in self.ctx.lora_order
                if (pair := adapter.pairs.get(w.name)) is not None]

    def _lora_matmuls(self, halves: list[Weight], x: np.ndarray, quantized: dict[int, np.ndarray]) -> list[np.ndarray]:
        """x @ w.T for LoRA halves, in one parallel region: held as loaded, in the CPU buffer
        (llama.cpp never repacks them)."""
        xqs = [self._quantized(x, w, quantized) for w in halves]
        outs = []
        for w, xq in zip(halves, xqs):
            outs.append(self.new(x.shape[0], w.data.shape[0]))
            self.plan.matmul(int(w.kernel_type), w.data.view(np.uint8), x.shape[1], xq, outs[-1],
                             matmul_storage(w.kernel_type, repacked=False), self.n_threads)
        if 1 < len(halves) <= MAX_GROUP:
            self.plan.group_matmuls(len(halves))
        return outs

    def _add_scaled(self, x: np.ndarray, delta: np.ndarray, s: float) -> None:
        """x += s * delta, as ggml_scale then ggml_add."""
        self.plan.scale(delta, s)
        self.plan.add(x, delta)

    def project_by_seq(self, x: np.ndarray, w: Weight) -> np.ndarray:
        """x @ W.T as ggml multiplies a 3-D input ({n_embd, n_seq_tokens, n_seqs}, a recurrent
        model's equal-split ubatch): one matmul per sequence's rows, whose count decides ggml's
        kernel path; x quantized once (row by row, as each matmul would)."""
        n_seqs = self.ub.n_rs_seqs
        if n_seqs <= 1:
            return self.project(x, w)[0]
        if self.ub.n_tokens > 1:
            self.boundary()
            self.observe(x, (w,))
        xq = self._quantized(x, w, {})
        out = self.new(x.shape[0], w.data.shape[0])
        nst = x.shape[0] // n_seqs
        for q in range(n_seqs):
            rows = slice(q * nst, (q + 1) * nst)
            self.plan.matmul(int(w.kernel_type), w.data.view(np.uint8), x.shape[1], xq[rows], out[rows],
                             matmul_storage(w.kernel_type, rows16=w.rows16), self.n_threads)
        return out

    def split(self, x: np.ndarray, *widths: int) -> tuple[np.ndarray, ...]:
        """Cut the columns of x into contiguous pieces of the given widths (fused projections)."""
        if sum(widths) != x.shape[1]:
            raise ValueError(f"widths {widths} do not add up to {x.shape[1]} columns")
        outs, start = [], 0
        for width in widths:
            out = self.new(x.shape[0], width)
            self.plan.copy(x, start, out)
            outs.append(out)
            start += width
        return tuple(outs)

    # -- mixture of experts

    def moe_ffn(self, x: np.ndarray, L: Layer, *, norm_w: bool, gating: int = GATING_SOFTMAX,
                w_scale: float = 0.0, swiglu_limit: float = 0.0, biases: bool = False,
                selection_bias: Weight | None = None, logits: np.ndarray | None = None,
                act: int = GLU_SWIGLU, gate_up: Weight | None = None,
                down_scale: Weight | None = None, weight_before: bool = False) -> np.ndarray:
        """llama.cpp's build_moe_ffn with SwiGLU experts: route every row of x ([n, n_embd]) to
        n_expert_used of the layer's experts (router ``ffn_gate_inp``), run each expert once
        over the rows routed to it, and sum the expert outputs by their routing weights. With
        ``biases`` (an architecture that declares them) the biases of the router and of the
        experts are added where the layer has them; ``selection_bias`` (``exp_probs_b``) is added
        to the probabilities that rank the experts, among the best groups only where the model
        groups its experts (``n_expert_groups``); ``swiglu_limit`` selects gpt-oss's clamped
        SwiGLU (alpha 1.702) instead of the plain one. ``logits``: the router's logits computed
        elsewhere (SmallThinker routes on the block's input, build_moe_ffn's probs_in); ``act``:
        the experts' gated activation (GLU_REGLU: SmallThinker's ReLU); ``gate_up``: the gate and
        up matrices as one (``ffn_gate_up_exps``, gate first), in place of the layer's two;
        ``down_scale``: one F32 factor per expert for its down projection's output (llama.cpp's
        ``ffn_down_exps.scale``, Gemma 4's per-expert scale); ``weight_before``: each expert's
        input is the row times its routing weight and the outputs are summed as they are
        (Llama 4's weight_before_ffn)."""
        hp = self.hparams
        n, k = x.shape[0], hp.n_expert_used
        bias = None if selection_bias is None else selection_bias.data  # ranks only
        router_b, gate_b, up_b, down_b = (L.ffn_gate_inp_bias, L.ffn_gate_exps_bias, L.ffn_up_exps_bias,
                                          L.ffn_down_exps_bias) if biases else (None,) * 4
        if n == 1 and not swiglu_limit and logits is None and act == GLU_SWIGLU and gate_up is None and \
                down_scale is None and not weight_before and all(b is None for b in (router_b, gate_b, up_b, down_b)) and \
                not self.loras(L.ffn_gate_inp):
            weights = (L.ffn_gate_inp, L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps)
            partners = [quants.type_traits(int(w.kernel_type))["vec_dot_type"] for w in weights]
            if partners[1] == partners[2]:
                return self.moe_one(x, bias, weights, partners, gating, norm_w, w_scale)
        groups = (hp.n_expert_groups, hp.n_group_used)
        if logits is None:
            (logits,) = self.project(x, L.ffn_gate_inp)                       # [n, n_expert]
        self.add_bias(logits, router_b)
        route = (self.new(n, k, dtype=np.int32), self.new(n, k), self.new(hp.n_expert + 1, dtype=np.int32),
                 self.new(n * k, dtype=np.int32), self.new(n * k, dtype=np.int32))
        self.plan.moe_route(logits, hp.n_expert, k, gating, norm_w, w_scale, route, bias, groups)
        if weight_before:   # the weighted rows, in expert order
            rows = self.new(n * k, x.shape[1])
            self.plan.moe_gather_weighted(x, route, hp.n_expert, k, rows)
            gate, up = self.project_experts(rows, route, L.ffn_gate_exps, L.ffn_up_exps, by_expert=True)
        elif gate_up is None:
            gate, up = self.project_experts(x, route, L.ffn_gate_exps, L.ffn_up_exps)  # [n * k, n_ff_exp], by expert
        else:
            (both,) = self.project_experts(x, route, gate_up)                   # [n * k, 2 * n_ff_exp]
            gate, up = both[:, :both.shape[1] // 2], both[:, both.shape[1] // 2:]
        for t, b in ((up, up_b), (gate, gate_b)):
            if b is not None:
                self.plan.moe_add_id(t, b.data, route)
        if swiglu_limit:
            hidden = self.new(*gate.shape)
            self.plan.swiglu_oai(gate, up, 1.702, swiglu_limit, hidden, self.n_threads)
        else:
            hidden = self.glu(act, gate, up)
        (down,) = self.project_experts(hidden, route, L.ffn_down_exps, by_expert=True)
        if down_scale is not None:
            self.plan.moe_scale_id(down, down_scale.data.reshape(-1), route)
        if down_b is not None:
            self.plan.moe_add_id(down, down_b.data, route)
        out = self.new(n, hp.n_embd)
        self.plan.moe_combine(down, route, k, out, not weight_before)        # [n, n_embd]
        return out

    def moe_one(self, x: np.ndarray, bias: np.ndarray | None, weights: tuple[Weight, ...], partners: list[int],
                gating: int, norm_w: bool, w_scale: float) -> np.ndarray:
        """moe_ffn's steps for a single token (a generation step), router included, in one node,
        one parallel region: the buffers those steps use, handed to the kernel together."""
        hp, k = self.hparams, self.hparams.n_expert_used
        router, experts = weights[0], weights[1:]
        n_ff = experts[0].shape[1]
        route = (self.new(1, k, dtype=np.int32), self.new(1, k), self.new(hp.n_expert + 1, dtype=np.int32),
                 self.new(k, dtype=np.int32), self.new(k, dtype=np.int32))
        xr = self.new(1, quants.row_bytes(partners[0], hp.n_embd), dtype=np.uint8)   # x for the router
        xq = self.new(k, quants.row_bytes(partners[1], hp.n_embd), dtype=np.uint8)   # x once per slot
        outs = (self.new(1, router.data.shape[0]),                                   # router logits
                self.new(k, n_ff), self.new(k, n_ff), self.new(k, hp.n_embd))        # gate, up, down
        act = self.new(k, n_ff)
        act_q = self.new(k, quants.row_bytes(partners[3], n_ff), dtype=np.uint8)
        out = self.new(1, hp.n_embd)
        self.plan.moe_one(x, bias, hp.n_expert, k, gating, norm_w, w_scale, route, xr, xq,
                          ((int(router.kernel_type), router.data.view(np.uint8),
                            matmul_storage(router.kernel_type, rows16=router.rows16)),) +
                          tuple((int(w.kernel_type), w.data.view(np.uint8), w.shape[1]) for w in experts),
                          outs, act, act_q, out, self.n_threads, (hp.n_expert_groups, hp.n_group_used))
        return out

    def project_experts(self, x: np.ndarray, route: tuple[np.ndarray, ...], *weights: Weight,
                        by_expert: bool = False) -> tuple[np.ndarray, ...]:
        """For every (row, slot) pair of the routing, the row of x times the chosen expert's
        matrix of each 3-D weight ([n_expert][n_out, n_in]); the results ([n * k, n_out]) and,
        with ``by_expert``, x itself are in the routing's expert order."""
        if self.ub.n_tokens > 1:
            self.boundary()
            self.observe(x, weights, route, by_expert)
        n_sorted = len(route[3])
        quantized: dict[int, np.ndarray] = {}
        partners = [quants.type_traits(int(w.kernel_type))["vec_dot_type"] for w in weights]
        for partner in partners:
            if partner not in quantized:
                xq = self.new(x.shape[0], quants.row_bytes(partner, x.shape[1]), dtype=np.uint8)
                self.plan.quantize(partner, x, xq, self.n_threads)
                if not by_expert:  # each row once per slot, grouped by expert
                    rows = self.new(n_sorted, xq.shape[1], dtype=np.uint8)
                    self.plan.moe_gather(xq, route, rows)
                    xq = rows
                quantized[partner] = xq
        outs = []
        for w, partner in zip(weights, partners):
            n_out = w.shape[1]
            out = self.new(n_sorted, n_out)
            # every expert matrix is in llama.cpp's repack buffer where its type has a layout there
            self.plan.matmul_id(int(w.kernel_type), w.data.view(np.uint8), n_out, w.shape[0], quantized[partner], out,
                                route, w.shape[2], True, self.n_threads)
            outs.append(out)
        if len(weights) > 1:
            self.plan.group_matmul_ids(len(weights))
        return tuple(outs)

    def shared_expert_gate(self, x: np.ndarray, shared: np.ndarray, w: Weight) -> np.ndarray:
        """shared[t] *= sigmoid(w . x[t]), computed as llama.cpp does: silu(g) / g of the
        one-column projection g (Qwen 2 MoE's shared-expert gate)."""
        (g,) = self.project(x, w.as_matrix())                                # [n, 1]
        self.plan.moe_shared_gate(g, shared)
        return shared

    def linear(self, x: np.ndarray, w: Weight, b: Weight | None = None) -> np.ndarray:
        return self.add_bias(self.project(x, w)[0], b)

    # -- attention

    def rope(self, x: np.ndarray, il: int, n_head: int) -> np.ndarray:
        """Rotate x ([n_tokens, n_head * head_dim]) in place by the ubatch positions."""
        hp = self.hparams
        if hp.has_rope(il):
            rc = self.ctx.rope_config(il)
            self.plan.rope(x, n_head, hp.rot(il), hp.rope_type is RopeType.NEOX, rc.freq_base,
                           rc.freq_scale, rc.ext_factor, rc.attn_factor, rc.beta_fast, rc.beta_slow,
                           rc.n_ctx_orig, rc.freq_factors, self.n_threads)
        return x

    def rope_qk(self, q: np.ndarray, k: np.ndarray, il: int, q_norm: Weight | None = None,
                k_norm: Weight | None = None) -> None:
        """Rotate Q then K of layer ``il`` in place, each first RMS-normed per head where its
        norm is given (Qwen 3, Gemma 3; OLMoE's span the row), in llama.cpp's graphs' order."""
        self.rope(self.rms_norm_heads(q, q_norm), il, self.hparams.n_head[il])
        self.rope(self.rms_norm_heads(k, k_norm), il, self.hparams.n_head_kv[il])

    def attention(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray | None,
                  kq_scale: float, sinks: Weight | None = None, rel_bias: np.ndarray | None = None,
                  causal_no_cache: bool = False) -> np.ndarray:
        """Store k, v in the layer's cache cells, then attend q over the cache; without a cache
        (encoders), attend q over the ubatch's own k and v, non-causally as llama.cpp's encode
        does. Either way with sliding windows and ALiBi biases where the model has them
        (``f_max_alibi_bias``): each score gets slope(head) * -|p_cell - p_token|, the cell's
        position as the cache holds it (after seq_add / seq_div: no K to re-rotate). ``sinks``: one logit per head that
        joins the softmax (gpt-oss). ``v`` None: V is the first n_embd_head_v values of K's rows
        (multi-head latent attention's cache, which keeps no V rows). ``k`` and ``v`` None: the
        layer attends over the cache of the earlier layer it shares (``hparams.kv_source``).
        ``rel_bias``: T5's relative position biases (:meth:`t5_rel_bias`), bidirectional without a
        cache, over past positions with one. ``causal_no_cache``: without a cache, mask future
        tokens all the same (llama.cpp's t5encoder decoded rather than encoded)."""
        hp = self.hparams
        dk, dv = hp.head_k(il), hp.head_v(il)
        out = self.new(self.ub.n_tokens, hp.n_head[il] * dv)
        if not self.model.architecture.kv_cache or self.encoding:
            self.plan.attention_self(q, k, v, hp.n_head[il], hp.n_head_kv[il], dk, dv,
                                     kq_scale, causal_no_cache, hp.f_max_alibi_bias, out, self.n_threads,
                                     hp.n_swa if hp.is_swa(il) else 0, hp.swa_symmetric, rel_bias)
            return out
        src = hp.kv_source(il)   # a layer sharing an earlier one's cache stores nothing (k, v None)
        ci, cache = self.ctx.cache_for_layer(src)
        k_store, v_store = cache.k[src], cache.k[src] if hp.is_mla else cache.v[src]
        if k_store.rotation:   # a quantized cache holds rotated rows (gguflm.kv_store.rotation)
            self.plan.hadamard(q, k_store.rotation, self.n_threads)
        for x, store in ((k, k_store), (v, v_store)):
            if x is not None:
                if store.rotation:
                    self.plan.hadamard(x, store.rotation, self.n_threads)
                self.plan.kv_store(store.cache_type, store.data, ci, x)
        self.plan.attention(q, k_store.cache_type, k_store.data, v_store.cache_type, v_store.data, ci,
                            cache.pos, cache.seq, hp.n_head[il], hp.n_head_kv[il], dk, dv, kq_scale, hp.causal_attn,
                            hp.n_swa if hp.is_swa(il) else 0, hp.f_attn_logit_softcapping, out,
                            self.n_threads, None if sinks is None else sinks.data, cache.n_stream > 1,
                            hp.f_max_alibi_bias, rel_bias, swa_chunked=hp.swa_chunked)
        if not hp.is_mla and v_store.rotation:
            self.plan.hadamard(out, v_store.rotation, self.n_threads)
        return out

    # -- recurrent states (src/ssm.h; the states are the recurrent memory's rows)

    def recurrent_moves(self) -> None:
        """First in a recurrent model's pass: the state moves its memory staged for this ubatch
        (cells that changed place, copies of shared states, zeroed new ones)."""
        _, cache = self.ctx.recurrent_for_layer(self.model.architecture.recurrent_layers(self.hparams)[0])
        self.plan.rs_moves(cache.moves, cache.r_all, cache.s_all)

    def ssm_conv(self, il: int, x: np.ndarray, w: Weight, b: Weight) -> np.ndarray:
        """silu(conv1d(state ++ x) + b) of layer ``il``'s conv (ggml_ssm_conv, add, silu), its conv
        states moved on: x [n_tokens, d_inner] -> [n_tokens, d_inner]."""
        _f32(w, b)
        ci, cache = self.ctx.recurrent_for_layer(il)
        out = self.new(*x.shape)
        self.plan.ssm_conv(cache.r[il], ci, x, w.data, b.data, out, self.n_threads)
        return out

    def ssm_scan(self, il: int, x: np.ndarray, dt: np.ndarray, A: Weight, B: np.ndarray, C: np.ndarray,
                 D: Weight) -> np.ndarray:
        """Mamba-1's selective scan of layer ``il`` (ggml_ssm_scan, then + x * D), its SSM states
        moved on: x, dt [n_tokens, d_inner], B, C [n_tokens, d_state] -> [n_tokens, d_inner]."""
        _f32(A, D)
        ci, cache = self.ctx.recurrent_for_layer(il)
        out = self.new(*x.shape)
        self.plan.ssm_scan(cache.s[il], ci, x, dt, A.data, B, C, D.data, out, self.n_threads)
        return out

    def ssm_scan_grouped(self, il: int, x: np.ndarray, dt: np.ndarray, dt_b: Weight, A: Weight, B: np.ndarray,
                         C: np.ndarray, D: Weight, n_group: int) -> np.ndarray:
        """Mamba-2's selective scan of layer ``il`` (ggml_ssm_scan with a decay per head, then
        + x * D), its SSM states moved on: x [n_tokens, d_inner], dt [n_tokens, n_head] (+ dt_b),
        B, C [n_tokens, n_group * d_state] -> [n_tokens, d_inner]."""
        _f32(dt_b, A, D)
        ci, cache = self.ctx.recurrent_for_layer(il)
        out = self.new(*x.shape)
        self.plan.ssm_scan_grouped(cache.s[il], ci, x, dt, dt_b.data, A.data.reshape(-1), B, C, D.data.reshape(-1),
                                   n_group, out, self.n_threads)
        return out

    # -- hybrid models (Mamba + attention)

    def relu_sqr(self, x: np.ndarray) -> np.ndarray:
        """relu(x)², as ggml_relu then ggml_sqr (Nemotron-H's feed-forward)."""
        out = self.new(*x.shape)
        self.plan.unary(UNARY_RELU_SQR, x, out, self.n_threads)
        return out

    def control_vector_branch(self, x: np.ndarray, il: int) -> np.ndarray:
        """x += layer ``il``'s control vector, in place, where the context has one: for graphs
        that add it to a branch before its residual add (Nemotron-H's feed-forward layers)."""
        direction = self.ctx.cvec.direction(il)
        if direction is not None:
            self.plan.add_row(x, direction)
        return x

    # -- Gemma 3n: AltUp's streams, Laurel's low-rank residual, activation sparsity (src/altup.h)

    def altup_stack(self, n: int) -> np.ndarray:
        """A new stack of the ALTUP_N streams of n rows ([ALTUP_N, n, n_embd]: ggml's
        [n_embd, n_tokens, n_altup])."""
        return self.new(ALTUP_N, n, self.hparams.n_embd)

    def altup_streams(self, x: np.ndarray, proj: Weight) -> np.ndarray:
        """AltUp's streams of x ([n, n_embd]): x itself, then x through each matrix of ``proj``
        ([ALTUP_N - 1][n_embd, n_embd]) rescaled to x's magnitude: a new stack."""
        stack = self.altup_stack(x.shape[0])
        self.plan.copy(x, 0, stack[0])
        self.slice_matmuls([x] * (ALTUP_N - 1), proj, list(stack[1:]))
        for rows in stack[1:]:
            self.altup_rescale(x, rows)
        return stack

    def altup_merge(self, stack: np.ndarray, unembd: Weight) -> np.ndarray:
        """The mean of stream 0 and the others through the matrices of ``unembd``, each rescaled to
        stream 0's magnitude, summed in stream order (in place of stream 0, which it returns)."""
        back = self.slice_matmuls(list(stack[1:]), unembd)
        for rows in back:
            self.altup_rescale(stack[0], rows)
        x = stack[0]
        for rows in back:
            self.add(x, rows)
        return self.scale(x, 1.0 / ALTUP_N)

    def scaled_rows(self, x: np.ndarray, w: Weight) -> np.ndarray:
        """x times the weight row w (ggml_mul by a broadcast row) into a new buffer."""
        out = self.new(*x.shape)
        self.plan.copy(x, 0, out)
        self.plan.mul_row(out, w.data.reshape(-1))
        return out

    def altup_rescale(self, target: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """rows *= |target| / |rows|, row by row, in place (llama.cpp's gemma3n magnitude matching:
        ggml_mul by the target's L2 norm, then ggml_div by the rows' own)."""
        self.plan.altup(ALTUP_KINDS["rescale"], rows, self.n_threads, x=target)
        return rows

    def gaussian_topk(self, x: np.ndarray) -> np.ndarray:
        """relu(x - (mean + std_mul * std)) per row, in place: Gemma 3n's activation sparsity, which
        keeps about the top 5 % of a normal row (std over n - 1; std_mul = the normal's 95th
        percentile, 1.6448533535003662 as llama.cpp fixes it)."""
        self.plan.altup(ALTUP_KINDS["topk"], x, self.n_threads, f=1.6448533535003662)
        return x

    def altup_predict(self, stack: np.ndarray, coefs: np.ndarray) -> np.ndarray:
        """AltUp's prediction: stream j plus the mix of all streams by the token's coefficients
        (coefs [n, ALTUP_N * ALTUP_N], the mix into stream j at j * ALTUP_N): a new stack."""
        out = self.altup_stack(stack.shape[1])
        self.plan.altup(ALTUP_KINDS["predict"], out[0], self.n_threads, x=stack[0], y=coefs, slice=out[0].size)
        return out

    def altup_correct(self, stack: np.ndarray, activated: np.ndarray, coefs: np.ndarray) -> np.ndarray:
        """AltUp's correction: stream j plus (activated - stream 0) * (coefs[:, j] + 1): a new stack."""
        out = self.altup_stack(stack.shape[1])
        self.plan.altup(ALTUP_KINDS["correct"], out[0], self.n_threads, x=stack[0], y=coefs, w=activated,
                        slice=out[0].size)
        return out

    def slice_matmuls(self, xs: Sequence[np.ndarray], w: Weight,
                      outs: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """ggml_mul_mat of a 3-D weight ([n_slice][n_out, n_in]) by as many slices of rows:
        xs[s] @ W[s].T, into ``outs`` where given; a slice given twice is quantized once."""
        n_in, n_out, n_slice = w.shape
        if len(xs) != n_slice:
            raise ValueError(f"{len(xs)} slices for the {n_slice} matrices of '{w.name}'")
        partner = quants.type_traits(int(w.kernel_type))["vec_dot_type"]
        rows = w.data.reshape(n_slice, n_out, -1)
        quantized: dict[int, np.ndarray] = {}
        outs = list(outs) if outs is not None else [self.new(x.shape[0], n_out) for x in xs]
        for s, (x, out) in enumerate(zip(xs, outs)):
            if id(x) not in quantized:
                quantized[id(x)] = self.new(x.shape[0], quants.row_bytes(partner, n_in), dtype=np.uint8)
                self.plan.quantize(partner, x, quantized[id(x)], self.n_threads)
            # a 3-D weight stays in llama.cpp's plain CPU buffer: its repack takes matrices only
            self.plan.matmul(int(w.kernel_type), rows[s].view(np.uint8), n_in, quantized[id(x)], out,
                             matmul_storage(w.kernel_type, repacked=False), self.n_threads)
        return outs

    def altup_layer_output(self, stack: np.ndarray) -> None:
        """Mark the whole stack as the block's output: a control vector joins every stream."""
        self._last_add = stack.reshape(-1, stack.shape[2])

    # -- multi-head latent attention (DeepSeek-V2's MLA, llama.cpp's absorbed form)

    def rope_heads_part(self, x: np.ndarray, il: int, n_head: int, head_stride: int) -> np.ndarray:
        """Rotate, in place by the ubatch positions, the n_rot values that start each of n_head
        heads ``head_stride`` values apart; x is a view of the rows starting at the first head's
        rotated values (MLA's heads end with them)."""
        hp = self.hparams
        rc = self.ctx.rope_config(il)
        self.plan.rope(x, n_head, hp.n_rot, hp.rope_type is RopeType.NEOX, rc.freq_base, rc.freq_scale,
                       rc.ext_factor, rc.attn_factor, rc.beta_fast, rc.beta_slow, rc.n_ctx_orig, rc.freq_factors,
                       self.n_threads, head_stride=head_stride)
        return x

    def head_matmuls(self, x: np.ndarray, x_head: int, w: Weight, out: np.ndarray, out_head: int,
                     strided_input: bool = False) -> np.ndarray:
        """ggml_mul_mat of a 3-D weight ([n_head][n_out, n_in]) by the heads of x: for each head h
        out[:, h * out_head : + n_out] = x[:, h * x_head : + n_in] @ W[h].T. ``strided_input``: ggml
        reads x through a permuted view, for which it skips llamafile's sgemm where x is already
        in the weight's dot partner (F32 weights: each product a vec_dot, as a one-token matmul)."""
        n_in, n_out, n_head = w.shape
        partner = quants.type_traits(int(w.kernel_type))["vec_dot_type"]
        rows = w.data.reshape(n_head, n_out, -1)
        per_token = strided_input and partner == int(GGMLType.F32)
        for h in range(n_head):
            xq = self.new(x.shape[0], quants.row_bytes(partner, n_in), dtype=np.uint8)
            self.plan.quantize(partner, x[:, h * x_head:h * x_head + n_in], xq, self.n_threads)
            # a 3-D weight stays in llama.cpp's plain CPU buffer: its repack takes matrices only
            self.plan.matmul(int(w.kernel_type), rows[h].view(np.uint8), n_in, xq,
                             out[:, h * out_head:h * out_head + n_out], matmul_storage(w.kernel_type, repacked=False),
                             self.n_threads, per_token=per_token)
        return out

    def mla_decompressed(self, il: int, q: np.ndarray, kv: np.ndarray, L: Layer) -> tuple[np.ndarray, ...]:
        """Latent attention's Q, K and V as full heads (MiniCPM3; llama.cpp's deepseek2 graph without
        the absorbed form): q [n, n_head * key_length] the query heads, their last n_rot values
        rotated here; kv [n, kv_lora_rank + n_rot] (``attn_kv_a_mqa``'s output), whose normed latent
        ``attn_kv_b`` expands to each head's [non-rotated K, V] and whose rotated tail every head's K
        ends with. Returns q, K [n, n_head * key_length], V [n, n_head * value_length]."""
        hp = self.hparams
        n, n_head, rank, n_rot = q.shape[0], hp.n_head[il], hp.n_lora_kv, hp.n_rot
        dk, dv = hp.n_embd_head_k, hp.n_embd_head_v
        nope = dk - n_rot
        self.rope_heads_part(q[:, nope:], il, n_head, dk)
        latent = self.new(n, rank)
        self.plan.rms_norm(kv[:, :rank], L.attn_kv_a_norm.data, hp.f_norm_rms_eps, latent, self.n_threads)
        k_pe = self.new(n, n_rot)
        self.plan.copy(kv, rank, k_pe)
        self.rope_heads_part(k_pe, il, 1, n_rot)
        (kv_heads,) = self.project(latent, L.attn_kv_b)                 # [n, n_head * (nope + value_length)]
        k, v = self.new(n, n_head * dk), self.new(n, n_head * dv)
        for h in range(n_head):
            self.plan.copy(kv_heads, h * (nope + dv), k[:, h * dk:h * dk + nope])
            self.plan.copy(k_pe, 0, k[:, h * dk + nope:(h + 1) * dk])
            self.plan.copy(kv_heads, h * (nope + dv) + nope, v[:, h * dv:(h + 1) * dv])
        return q, k, v

    def mla_attention(self, il: int, q: np.ndarray, kv: np.ndarray, L: Layer, kq_scale: float) -> np.ndarray:
        """Multi-head latent attention of layer ``il`` as llama.cpp's deepseek2 graph runs it (the
        absorbed form: one latent K row per token, MQA over it): q [n, n_head * (nope + n_rot)] the
        query heads, kv [n, kv_lora_rank + n_rot] the compressed K/V and the shared rotated part
        (``attn_kv_a_mqa``'s output) -> [n, n_head * n_embd_head_v_mla], before the output
        projection. K = [rms_norm(latent), rope(k_pe)] is what the cache keeps and V its latent;
        each head's query is [its non-rotated part through ``attn_k_b``, rope(its rotated part)],
        and each head's output the attended latent through ``attn_v_b``."""
        hp = self.hparams
        n, n_head, rank, n_rot = q.shape[0], hp.n_head[il], hp.n_lora_kv, hp.n_rot
        dq, dk = hp.n_embd_head_k_mla, hp.n_embd_head_k            # a query head's width, a cache row's
        nope = dq - n_rot
        k = self.new(n, dk)                                         # [n, kv_lora_rank + n_rot]
        self.plan.rms_norm(kv[:, :rank], L.attn_kv_a_norm.data, hp.f_norm_rms_eps, k[:, :rank], self.n_threads)
        self.plan.copy(kv, rank, k[:, rank:])
        self.rope_heads_part(k[:, rank:], il, 1, dk)
        qc = self.new(n, n_head * dk)                               # [n, n_head * (kv_lora_rank + n_rot)]
        self.head_matmuls(q, dq, L.attn_k_b, qc, dk, strided_input=True)
        for h in range(n_head):
            self.plan.copy(q, h * dq + nope, qc[:, h * dk + rank:(h + 1) * dk])
        self.rope_heads_part(qc[:, rank:], il, n_head, dk)
        latent = self.attention(il, qc, k, None, kq_scale)         # [n, n_head * kv_lora_rank]
        out = self.new(n, n_head * hp.n_embd_head_v_mla)
        return self.head_matmuls(latent, rank, L.attn_v_b, out, hp.n_embd_head_v_mla)
    # -- short convolutions and the gated delta-net (src/ssm.h, src/delta_net.h)

    def mul(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """x *= y elementwise (ggml_mul of same-shaped tensors), in place."""
        self.plan.mul(x, y)
        return x

    def sigmoid_mul(self, x: np.ndarray, gate: np.ndarray) -> np.ndarray:
        """x *= sigmoid(gate) (ggml_sigmoid, ggml_mul), in place: elementwise, or by one gate per
        row where gate is [n, 1]."""
        self.plan.sigmoid_mul(x, gate)
        return x

    def short_conv(self, il: int, x: np.ndarray, w: Weight, silu: bool = False) -> np.ndarray:
        """conv1d(state ++ x) of layer ``il`` without a bias (ggml_ssm_conv; then ggml_silu with
        ``silu``), its conv states moved on: x [n_tokens, n] -> [n_tokens, n]."""
        _f32(w)
        ci, cache = self.ctx.recurrent_for_layer(il)
        out = self.new(*x.shape)
        self.plan.ssm_conv(cache.r[il], ci, x, w.data, None, out, self.n_threads, silu)
        return out

    def l2_norm_heads(self, x: np.ndarray, head_dim: int) -> np.ndarray:
        """Every head's slice of x divided by its L2 norm, as llama.cpp's delta-net graphs build it:
        ggml_rms_norm with eps / head_dim, then ggml_scale by 1 / sqrt(head_dim). x: contiguous."""
        if not x.flags.c_contiguous:
            raise ValueError("l2_norm_heads reads the heads of contiguous rows")
        out = self.new(*x.shape)
        eps = self.hparams.f_norm_rms_eps
        self.plan.rms_norm(x.reshape(-1, head_dim), None, float(np.float32(eps) / np.float32(head_dim)),
                           out.reshape(-1, head_dim), self.n_threads)
        self.plan.scale(out, float(np.float32(1.0) / np.sqrt(np.float32(head_dim))))
        return out

    def repeat_heads(self, x: np.ndarray, head_dim: int, repeat: int) -> np.ndarray:
        """Every head of x ([n, n_head * head_dim]) ``repeat`` times in a row (ggml_repeat_4d of
        the heads as [head_dim, 1, n_head]): [n, n_head * repeat * head_dim]."""
        n_head = x.shape[1] // head_dim
        out = self.new(x.shape[0], n_head * repeat * head_dim)
        for h in range(n_head * repeat):
            self.plan.copy(x, (h // repeat) * head_dim, out[:, h * head_dim:(h + 1) * head_dim])
        return out

    def gdn_gates(self, alpha: np.ndarray, dt_b: Weight, A: Weight, beta: np.ndarray) -> None:
        """In place: alpha = softplus(alpha + dt_b) * A (the log-decays), beta = sigmoid(beta)."""
        _f32(dt_b, A)
        self.plan.gdn_gates(alpha, dt_b.data.reshape(-1), A.data.reshape(-1), beta)

    def gated_delta_net(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                        beta: np.ndarray) -> np.ndarray:
        """The gated delta-net of layer ``il`` (ggml_gated_delta_net), its states moved on: q, k
        [n_tokens, n_head_k * d], v [n_tokens, n_head_v * d], g, beta [n_tokens, n_head_v] ->
        [n_tokens, n_head_v * d]."""
        ci, cache = self.ctx.recurrent_for_layer(il)
        out = self.new(*v.shape)
        self.plan.gated_delta_net(cache.s[il], ci, q, k, v, g, beta, g.shape[1], out, self.n_threads)
        return out

    # -- RWKV (src/wkv.h; the states are the recurrent memory's rows)

    def wkv_shift(self, il: int, x: np.ndarray, slot: int) -> np.ndarray:
        """Each row of x one token back within its sequence, the first from slot ``slot`` of
        layer ``il``'s token-shift states, which then keep the sequence's last row (llama.cpp's
        token_shift load, concat and store): x [n_tokens, n_embd] -> [n_tokens, n_embd]."""
        ci, cache = self.ctx.recurrent_for_layer(il)
        out = self.new(*x.shape)
        self.plan.wkv(wkv.KINDS["shift"], (x,), (out,), 1, state=cache.r[il], cache_index=ci,
                      state_offset=slot * x.shape[1])
        return out

    def wkv_lerp(self, cur: np.ndarray, prev: np.ndarray, mu: Weight,
                 adds: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """RWKV's token-shift mixes, one per row of ``mu`` ([n_mix, n_embd] values): (mu + add) *
        (prev - cur) + cur, written over ``adds`` when given (ggml_sub, add, mul, add)."""
        _f32(mu)
        mus = mu.data.reshape(-1, cur.shape[1])
        outs = list(adds) if adds is not None else [self.new(*cur.shape) for _ in range(mus.shape[0])]
        xs = (cur, prev) + (tuple(adds) if adds is not None else (None,) * len(outs))
        self.plan.wkv(wkv.KINDS["lerp"], xs, tuple(outs), self.n_threads, (mus,))
        return outs

    def wkv_map(self, kind: str, *xs: np.ndarray, p: Weight | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
        """One of wkv.h's element-wise chains (``decay6``, ``sigmoid``, ``value_mix``, ...) over
        rows of xs and the parameter row p, into ``out`` (x0 itself is allowed) or a new buffer."""
        if p is not None:
            _f32(p)
        out = self.new(*xs[0].shape) if out is None else out
        self.plan.wkv(wkv.KINDS[kind], xs, (out,), self.n_threads, () if p is None else (p.data.reshape(-1),))
        return out

    def wkv6(self, il: int, k: np.ndarray, v: np.ndarray, r: np.ndarray, u: Weight, w: np.ndarray) -> np.ndarray:
        """RWKV-6's WKV of layer ``il`` (ggml_rwkv_wkv6), its states moved on: k, v, r, w
        [n_tokens, n_embd] in heads of ``wkv_head_size``, u (time_first) [n_embd]."""
        _f32(u)
        ci, cache = self.ctx.recurrent_for_layer(il)
        out = self.new(*k.shape)
        self.plan.wkv(wkv.KINDS["wkv6"], (k, v, r, w), (out,), self.n_threads, (u.data.reshape(-1),),
                      self.hparams.extras["head_size"], cache.s[il], ci)
        return out

    def wkv_gla(self, il: int, k: np.ndarray, v: np.ndarray, q: np.ndarray, g: np.ndarray, scale: float) -> np.ndarray:
        """Gated linear attention of layer ``il`` (ggml_gated_linear_attn, QRWKV-6), its states
        moved on: k, v, q, g (the decays) [n_tokens, n_embd] in heads of ``wkv_head_size``."""
        ci, cache = self.ctx.recurrent_for_layer(il)
        out = self.new(*k.shape)
        self.plan.wkv(wkv.KINDS["gla"], (k, v, q, g), (out,), self.n_threads, (), self.hparams.extras["head_size"],
                      cache.s[il], ci, scale=scale)
        return out

    def wkv_repeat_heads(self, x: np.ndarray, n: int) -> np.ndarray:
        """Each head of x's rows repeated to fill n values (ggml_repeat of grouped K/V heads)."""
        out = self.new(x.shape[0], n)
        self.plan.wkv(wkv.KINDS["repeat"], (x,), (out,), self.n_threads, (), self.hparams.extras["head_size"])
        return out

    def wkv7(self, il: int, r: np.ndarray, w: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray,
             b: np.ndarray) -> np.ndarray:
        """RWKV-7's WKV of layer ``il`` (ggml_rwkv_wkv7), its states moved on: all [n_tokens,
        n_embd] in heads of ``wkv_head_size``."""
        ci, cache = self.ctx.recurrent_for_layer(il)
        out = self.new(*k.shape)
        self.plan.wkv(wkv.KINDS["wkv7"], (r, w, k, v, a, b), (out,), self.n_threads, (),
                      self.hparams.extras["head_size"], cache.s[il], ci)
        return out

    def wkv7_keys(self, k: np.ndarray, a: np.ndarray, k_k: Weight, k_a: Weight) -> tuple[np.ndarray, np.ndarray]:
        """RWKV-7's keys: kk = l2_norm(k * k_k) per head; k += a * (k * k_a) - k * k_a in place;
        returns -kk and kk * a, the WKV's a and b."""
        _f32(k_k, k_a)
        neg_kk, kka = self.new(*k.shape), self.new(*k.shape)
        self.plan.wkv(wkv.KINDS["wkv7_keys"], (k, a), (k, neg_kk, kka), self.n_threads,
                      (k_k.data.reshape(-1), k_a.data.reshape(-1)), self.hparams.extras["head_size"])
        return neg_kk, kka

    def wkv7_bonus(self, cur: np.ndarray, k: np.ndarray, r: np.ndarray, v: np.ndarray, r_k: Weight) -> np.ndarray:
        """cur += v * sum_head(k * r * r_k), in place (RWKV-7's bonus of the current token)."""
        _f32(r_k)
        self.plan.wkv(wkv.KINDS["wkv7_bonus"], (k, r, v), (cur,), self.n_threads, (r_k.data.reshape(-1),),
                      self.hparams.extras["head_size"])
        return cur

    def wkv_group_norm(self, x: np.ndarray, w: Weight, b: Weight) -> np.ndarray:
        """LayerNorm of every head of x (eps 64e-5, as RWKV's graphs), then * w + b over the row."""
        rows = x.reshape(-1, self.hparams.extras["head_size"])
        out = self.new(*rows.shape)
        self.plan.layer_norm(rows, None, None, 64e-5, out, self.n_threads)
        out = out.reshape(x.shape)
        self.plan.mul_row(out, w.data.reshape(-1))
        self.plan.add_row(out, b.data.reshape(-1))
        return out

    def project_per_row(self, x: np.ndarray, w: Weight) -> np.ndarray:
        """x @ W.T as ggml multiplies a weight broadcast over one-row slices of x (RWKV-6's
        batched w2): one matmul per row, each rounding as a one-token matmul."""
        if self.ub.n_tokens > 1:
            self.boundary()
            self.observe(x, (w,))
        xq = self._quantized(x, w, {})
        out = self.new(x.shape[0], w.data.shape[0])
        for t in range(x.shape[0]):
            self.plan.matmul(int(w.kernel_type), w.data.view(np.uint8), x.shape[1], xq[t:t + 1], out[t:t + 1],
                             matmul_storage(w.kernel_type, rows16=w.rows16), self.n_threads)
        return out

    # -- the ALiBi families (bloom, mpt, jais, refact, baichuan 13B; the biases are attention()'s)

    def clamp_kqv(self, *xs: np.ndarray) -> None:
        """Each of xs clamped to [-c, c] in place, c the model's ``attention.clamp_kqv`` (ggml_clamp,
        as llama.cpp's build_qkv applies it to the fused or separate projections); nothing when
        the model has none."""
        c = self.hparams.f_clamp_kqv
        if c > 0:
            for x in xs:
                self.plan.clamp(x, -c, c)

    def attn_temperature(self, q: np.ndarray) -> np.ndarray:
        """Each query row (q [n_tokens, n_head * head_dim]) times the attention temperature of its
        token's position, where the model has one (Mistral 3, Llama 4: llama.cpp's
        inp_attn_scale, log(floor((pos + offset) / floor_scale) + 1) * scale + 1), in place."""
        hp = self.hparams
        if hp.f_attn_temp_scale:
            self.plan.attn_temp(q, hp.f_attn_temp_scale, hp.f_attn_temp_offset, hp.n_attn_temp_floor_scale)
        return q

    def xielu(self, x: np.ndarray, params: np.ndarray) -> np.ndarray:
        """xIELU in place (ggml_xielu, Apertus's activation); params: float32 [alpha_n, alpha_p, beta,
        eps] as the file gives them (the alphas go through softplus, as ggml_xielu takes them)."""
        self.plan.xielu(x, params)
        return x

    # -- T5 (relative position buckets; the decoder's cross-attention over the encoder's output)

    def t5_rel_bias(self, w: Weight) -> np.ndarray:
        """T5's relative position bias table (``attn_rel_b``, n_head values per bucket) as float32
        [n_buckets, n_head], as ggml_get_rows reads its rows for llama.cpp's build_pos_bias."""
        _file_layout(w)
        n_head, n_buckets = w.shape
        out = np.empty((n_buckets, n_head), np.float32)
        quants.dequantize(int(w.kernel_type), np.ascontiguousarray(w.data.view(np.uint8).reshape(n_buckets, -1)), out)
        return out

    def relu(self, x: np.ndarray) -> np.ndarray:
        """max(x, 0) in place (ggml_relu; T5's feed-forward without a gate)."""
        self.plan.clamp(x, 0.0, float("inf"))
        return x

    def cross_attention(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, enc: Any) -> np.ndarray:
        """Layer ``il``'s queries over K and V computed from the encoder's output rows ``enc``
        (a :class:`gguflm.context.EncoderOutput`; T5's cross-attention, scale 1, no bias): a
        token sees the encoder rows of its sequence."""
        hp = self.hparams
        out = self.new(self.ub.n_tokens, hp.n_head[il] * hp.head_v(il))
        self.plan.attention_cross(q, k, v, enc.pos, enc.seq, enc.n_rows, hp.n_head[il], hp.n_head_kv[il],
                                  hp.head_k(il), 1.0, out, self.n_threads)
        return out

    # -- outputs

    def output_rows(self, *xs: np.ndarray) -> tuple[np.ndarray, ...]:
        """Keep only the rows that produce output (llama.cpp's inp_out_ids before the last layer)."""
        if self.ub.n_outputs == self.ub.n_tokens:
            return xs
        outs = []
        for x in xs:
            out = self.new(self.ub.n_outputs, x.shape[1])
            self.plan.take_output_rows(x, out)
            outs.append(out)
        return tuple(outs)

    def pool_mean(self, x: np.ndarray) -> np.ndarray:
        """Each sequence's mean of the rows of x ([n_seqs, n_embd]), as ggml's F32 mul_mat sums it."""
        out = self.new(self.ub.n_seqs, x.shape[1])
        self.plan.pool_mean(x, out, self.n_threads)
        return out

    def pool_rows(self, x: np.ndarray) -> np.ndarray:
        """Each sequence's pooled row of x (its first or last token, as the pooling type says)."""
        out = self.new(self.ub.n_seqs, x.shape[1])
        self.plan.take_pool_rows(x, out)
        return out

    def pooling(self, embd: np.ndarray, pooling: PoolingType) -> np.ndarray | None:
        """The pooling stage of the forward pass (llama.cpp's build_pooling) over the final hidden
        states ``embd`` ([n_tokens, n_embd]): one row per sequence of the ubatch ([n_seqs, n_embd],
        or [n_seqs, n_cls_out] for rank), or None for ``none``."""
        if pooling is PoolingType.NONE:
            return None
        if pooling is PoolingType.MEAN:
            return self.pool_mean(embd)
        if pooling is not PoolingType.RANK:
            return self.pool_rows(embd)
        mean_first = self.hparams.pooling_type_cls == PoolingType.MEAN
        cur = self.pool_mean(embd) if mean_first else self.pool_rows(embd)
        # the classification head: dense + the model's activation, then the projection to the labels
        tensors = self.model.tensors
        cls = tensors.get("cls.weight")
        if cls is not None:
            cur = self.model.architecture.classifier_hidden(self, self.linear(cur, cls, tensors.get("cls.bias")))
        out = tensors.get("cls.output.weight")
        if out is not None:
            cur = self.linear(cur, out, tensors.get("cls.output.bias"))
        return cur

    def dense_out(self, x: np.ndarray) -> np.ndarray:
        """The dense projections of files converted with sentence-transformers' dense modules, after
        pooling (llama.cpp's build_dense_out): x @ dense_2 (+ its bias), then @ dense_3, each where the
        model has it; x itself for the others."""
        t = self.model.tensors
        if "dense_2.weight" in t:
            (x,) = self.project(x, t["dense_2.weight"])
        self.add_bias(x, t.get("dense_2.bias"))
        if "dense_3.weight" in t:
            (x,) = self.project(x, t["dense_3.weight"])
        return x

    def logits(self, x: np.ndarray, w: Weight) -> np.ndarray | None:
        """The output projection of x (None when the context asks for no logits)."""
        if not self.ctx.logits:
            return None
        (out,) = self.project(x, w)
        if self.hparams.f_logit_scale:
            self.plan.scale(out, self.hparams.f_logit_scale)
        if self.hparams.f_final_logit_softcapping:
            self.plan.softcap(out, self.hparams.f_final_logit_softcapping)
        return out
