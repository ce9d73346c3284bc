"""Recording a forward pass: the arena's layout (buffers alive at the same node never share bytes,
dead ones are reused) and the grouping of matmuls into one parallel region."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gguflm import Batch, Context, Model, quants, system
from gguflm.errors import BufferOverrunError
from gguflm._ext.plan import Plan
from gguflm.graph import Arena, Graph, UBatch

ARCH_DIR = Path(__file__).resolve().parent / "data" / "arch"


def _span(a: np.ndarray) -> tuple[int, int]:
    return a.ctypes.data, a.ctypes.data + a.nbytes


@st.composite
def recordings(draw):
    """Buffer sizes, the buffers each node uses (by index, some through views), the results."""
    sizes = draw(st.lists(st.integers(1, 3000), min_size=1, max_size=30))
    n = len(sizes)
    nodes = draw(st.lists(st.lists(st.integers(0, n - 1), min_size=1, max_size=4), max_size=40))
    results = draw(st.lists(st.integers(0, n - 1), max_size=3))
    views = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return sizes, nodes, results, views


@settings(max_examples=150, deadline=None)
@given(recordings())
def test_buffers_alive_together_never_overlap(recording):
    sizes, nodes, results, views = recording
    sizing = Arena()
    first = [sizing.take((size,), np.uint8) for size in sizes]

    def use(bufs: list[np.ndarray], i: int) -> np.ndarray:
        return bufs[i][1:] if views[i] and sizes[i] > 1 else bufs[i]

    packed = sizing.packed([tuple(use(first, i) for i in node) for node in nodes],
                           tuple(use(first, i) for i in results))
    laid = [packed.take((size,), np.uint8) for size in sizes]

    # lifetimes as node indices; results live past the last node, unused buffers only there
    end = len(nodes)
    born = [min([k for k, node in enumerate(nodes) if i in node] + [end]) for i in range(len(sizes))]
    dies = [max([k for k, node in enumerate(nodes) if i in node] + [end if i in results else -1, born[i]])
            for i in range(len(sizes))]
    start = min(_span(a)[0] for a in laid)  # the first buffer placed is at the block's start
    block = (start, start + packed.nbytes)
    for i, a in enumerate(laid):
        lo, hi = _span(a)
        assert block[0] <= lo and hi <= block[1] and lo % 64 == 0
        for j in range(i):
            if born[i] <= dies[j] and born[j] <= dies[i]:
                lo2, hi2 = _span(laid[j])
                assert hi <= lo2 or hi2 <= lo, f"buffers {j} and {i} overlap while both are alive"
    assert packed.nbytes <= sum(-(-s // 64) * 64 for s in sizes)


def test_a_recorded_forward_pass_reuses_memory():
    """A 64-token ubatch of the synthetic llama model: laid out, its buffers need a fraction of
    their sum, and the second recording takes exactly the buffers the first one did."""
    with Model.load(ARCH_DIR / "llama.gguf") as model, Context(model, n_ctx=256) as ctx:
        n = 64
        ub = UBatch(tokens=np.zeros(n, np.int32), embd=None, pos=np.arange(n, dtype=np.int32),
                    seq_first=np.zeros(n, np.int32), seq_mask=np.ones(n, np.uint64),
                    output_rows=np.array([n - 1]))

        def record(arena: Arena) -> Plan:
            plan = Plan(n, 1, 1)
            plan.results = model.architecture.forward(Graph(ctx, ub, plan, arena))
            return plan

        sizing = Arena()
        sized = record(sizing)
        packed = sizing.packed(sized.step_arrays, sized.results)
        replayed = record(packed)
        assert [b.shape for b in packed.buffers] == [b.shape for b in sizing.buffers]
        assert replayed.size == sized.size
        assert model.hparams.n_layer >= 2 and packed.nbytes < sizing.nbytes / 2


def test_only_matmuls_of_one_input_are_grouped():
    q8 = quants.get("Q8_0")
    w = q8.quantize(np.ones((8, 64), np.float32))
    xq2 = np.zeros((2, q8.row_bytes(64)), np.uint8)
    xq3 = np.zeros((3, q8.row_bytes(64)), np.uint8)
    plan = Plan(2, 1, 1)
    x = np.zeros((2, 64), np.float32)
    plan.scale(x, 2.0)
    plan.matmul(8, w, 64, xq2, np.zeros((2, 8), np.float32), True, 1)
    with pytest.raises(ValueError):
        plan.group_matmuls(2)                     # a scale is not a matmul
    plan.matmul(8, w, 64, xq3, np.zeros((3, 8), np.float32), True, 1)
    with pytest.raises(ValueError):
        plan.group_matmuls(2)                     # 2 and 3 input rows: not one input
    with pytest.raises(ValueError):
        plan.group_matmuls(5)                     # more than a region takes
    plan.matmul(8, w, 64, xq3, np.zeros((3, 8), np.float32), True, 1)
    plan.group_matmuls(2)


def test_grouped_matmuls_are_one_step_of_the_layout():
    """Q with an F32 weight and K, V with F16 weights share one input but not its quantized copy:
    the F32 copy is read by Q alone. The three matmuls run in one parallel region, so that copy
    must not share bytes with K's or V's output (laid over it, K's threads overwrote the input
    Q's threads were still reading: different logits at 2+ threads, and NaN)."""
    rng = np.random.default_rng(0)
    n_in, n_tok = 64, 1
    f32, f16 = quants.get("F32"), quants.get("F16")
    wq = f32.quantize(rng.standard_normal((64, n_in), dtype=np.float32))
    wk = f16.quantize(rng.standard_normal((32, n_in), dtype=np.float32))
    wv = f16.quantize(rng.standard_normal((32, n_in), dtype=np.float32))

    def record(arena: Arena) -> tuple[Plan, list[np.ndarray]]:
        plan = Plan(n_tok, 1, 1)
        x = arena.take((n_tok, n_in), np.float32)
        plan.scale(x, 1.0)
        xq32 = arena.take((n_tok, f32.row_bytes(n_in)), np.uint8)
        xq16 = arena.take((n_tok, f16.row_bytes(n_in)), np.uint8)
        plan.quantize(int(f32.type), x, xq32, 2)
        plan.quantize(int(f16.type), x, xq16, 2)
        outs = [arena.take((n_tok, w.shape[0]), np.float32) for w in (wq, wk, wv)]
        for w, xq, out in zip((wq, wk, wv), (xq32, xq16, xq16), outs):
            plan.matmul(int(f32.type if xq is xq32 else f16.type), w, n_in, xq, out, True, 2)
        plan.group_matmuls(3)
        plan.results = outs
        return plan, [xq32, *outs[1:]]

    sizing = Arena()
    sized, _ = record(sizing)
    _, (xq32, out_k, out_v) = record(sizing.packed(sized.step_arrays, sized.results))
    for out in (out_k, out_v):
        lo, hi = _span(out)
        assert hi <= _span(xq32)[0] or _span(xq32)[1] <= lo


def _record_copy(arena: Arena, overrun: int) -> Plan:
    """x -> out by a COPY node told that out's rows are ``overrun`` floats wider than they are."""
    plan = Plan(2, 2, 1)
    x = arena.take((2, 64), np.float32)
    plan.scale(x, 1.0)
    out = arena.take((2, 32), np.float32)
    plan.scale(out, 0.0)
    wide = np.lib.stride_tricks.as_strided(out, shape=(2, 32 + overrun), strides=out.strides)
    plan.copy(x, 0, wide)
    plan.scale(out, 2.0)
    plan.results = (out,)
    return plan


@pytest.mark.parametrize("overrun", [0, 1])
def test_guard_mode_catches_a_write_past_a_buffer(overrun):
    sizing = Arena()
    sized = _record_copy(sizing, overrun)
    arena = sizing.packed(sized.step_arrays, sized.results, guarded=True)
    plan = _record_copy(arena, overrun)
    plan.set_guards(*arena.guard_zones())
    if not overrun:
        plan.run()
        return
    with pytest.raises(BufferOverrunError, match=r"node 2 \(COPY\) wrote into guard zone 3"):
        plan.run()


def test_guard_mode_runs_a_model():
    """Guard mode: a real forward pass is laid out with guards, checked, and gives the same
    logits as without them."""
    with Model.load(ARCH_DIR / "gemma3.gguf") as model:
        logits = []
        for guard in (False, True):
            previous = system.set_guard_mode(guard)
            with Context(model, n_ctx=256, n_ubatch=7) as ctx:
                assert ctx.decode(Batch.get_one(list(range(3, 23)))) == 0
                assert ctx.decode(Batch.get_one([5])) == 0
                logits.append(ctx.get_logits_ith(-1).copy())
                assert any(plan.guarded for plan in ctx._plans.values()) == guard
            system.set_guard_mode(previous)
        np.testing.assert_array_equal(*logits)
