"""The kernels benchmark runs end to end (tiny sizes) and reports sane figures."""

from __future__ import annotations

import numpy as np
import pytest
from _ggml import same_arithmetic
from _llama import require_peer

import gguflm.quants as q
from gguflm import system
from gguflm.bench import ggml_peer, kernels
from gguflm.bench.__main__ import main as bench_main


def test_kernels_bench_quick_run(capsys):
    assert bench_main(["kernels", "--quick", "--types", "Q8_0,Q4_K"]) == 0
    printed = capsys.readouterr().out
    assert "memory read bandwidth" in printed and "Q4_K" in printed and "64x256" in printed


ISSUE_15 = ["IQ4_NL", "IQ4_XS", "MXFP4", "TQ1_0", "TQ2_0", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S",
            "IQ1_M"]


def test_kernels_bench_covers_issue_15_formats(capsys):
    assert set(ISSUE_15) <= set(kernels.TYPES)
    assert bench_main(["kernels", "--quick", "--types", ",".join(ISSUE_15)]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "x256" in line]
    assert rows == ISSUE_15


def test_kernels_bench_runs_the_arithmetic_asked_for(capsys):
    before = system.current_arithmetic()
    other = next(a for a in system.ARITHMETICS if a != before)
    try:   # the bench sets the switch for the rest of its process
        assert bench_main(["kernels", "--quick", "--types", "BF16", "--arith", other]) == 0
        assert system.current_arithmetic() == other
    finally:
        system.set_arithmetic(before)
    assert f"arithmetic {other}" in capsys.readouterr().out


def test_kernels_bench_run_returns_figures():
    lines = []
    result = kernels.run(types=["Q4_1"], shapes=[(40, 64)], threads=[1, 2], batch=3, membw_bytes=1 << 16,
                         repeat=1, out=lines.append)
    assert set(result["read_gbs"]) == {1, 2} and all(v > 0 for v in result["read_gbs"].values())
    (row,) = result["rows"]
    assert (row["type"], row["rows"], row["cols"], row["weight_bytes"]) == ("Q4_1", 40, 64, 40 * 40)
    assert all(v > 0 for v in row["gbs"].values()) and row["gflops"] > 0 and row["gbs_cpu"] > 0
    assert any(line.startswith("Q4_1") for line in lines)
    # the row's shares are against the figures measured around it, not the header's (the scalar
    # kernels have no int8 peak, GGUFLM_ISA=scalar, and so no share of it)
    assert row["read_gbs"] > 0
    if result["int8_peak_gops"] is None:
        assert row["int8_peak_gops"] is None and row["peak_share"] is None
    else:
        assert row["peak_share"] == row["gflops"] / row["int8_peak_gops"]


def test_kernels_bench_measures_the_int8_peak(capsys):
    """The batch GFLOP/s sit beside a measured int8 peak of the ISA that runs them (none for the
    scalar kernels), and AMX's state is said."""
    before = system.current_isa()
    try:
        for isa in system.supported_isas():
            system.set_isa(isa)
            result = kernels.run(types=["Q8_0"], shapes=[(32, 256)], threads=[1], batch=8, membw_bytes=1 << 16,
                                 repeat=1, out=print)
            (row,) = result["rows"]
            if isa == "scalar":
                assert result["int8_peak_gops"] is None and row["peak_share"] is None
            else:
                assert result["int8_peak_gops"] > 0 and 0 < row["peak_share"]
    finally:
        system.set_isa(before)
    printed = capsys.readouterr().out
    assert "int8 peak" in printed and "%peak" in printed and "AMX:" in printed


def test_kernels_bench_measures_amx_rows_against_the_amx_peak():
    """Where the tiles are on, the AMX peak is measured and Q4_0 and Q5_K batches (the repacked Q4_0
    recipe's AMX tiles, TILED's) are held against it, a Q8_0 one (no AMX part) against VNNI's;
    elsewhere there is no AMX peak and no row uses the tiles."""
    lines = []
    result = kernels.run(types=["Q4_0", "Q8_0", "Q5_K"], shapes=[(32, 256)], threads=[1], batch=16,
                         membw_bytes=1 << 16, repeat=1, out=lines.append)
    on = system.amx() and system.current_isa().startswith("avx512")
    q4, q8, q5k = result["rows"]
    assert (q4["amx"], q8["amx"], q5k["amx"]) == (on, False, on)
    if on:
        assert result["amx_peak_gops"] > result["int8_peak_gops"] > 0
        assert q4["int8_peak_gops"] >= result["amx_peak_gops"] and q4["peak_share"] == q4["gflops"] / q4["int8_peak_gops"]
        assert any(line.startswith("Q4_0") and line.endswith("%a") for line in lines)
        assert any(line.startswith("AMX int8 peak") for line in lines)
    else:
        assert result["amx_peak_gops"] is None


def test_kernels_bench_measures_weights_as_a_model_holds_them():
    """TQ1_0 streams its TQ2_0 blocks (66 bytes a super-block, not 54), Q4_0 its rows-16 copy."""
    lines = []
    result = kernels.run(types=["TQ1_0", "Q4_0"], shapes=[(32, 512)], threads=[1], batch=2, membw_bytes=1 << 16,
                         repeat=1, out=lines.append)
    tq1, q4 = result["rows"]
    assert (tq1["held_as"], tq1["weight_bytes"], tq1["rows16"]) == ("TQ2_0", 32 * 2 * 66, False)
    assert (q4["held_as"], q4["weight_bytes"], q4["rows16"]) == (None, 32 * 16 * 18, True)
    assert any(line.startswith("TQ1_0") and "32x512h" in line for line in lines)


def test_kernels_bench_compares_with_llama_cpp_on_the_same_weights(capsys):
    """--compare llama-cpp times llama.cpp's ggml-cpu on each row's weights (file layout, repacked
    where llama.cpp repacks), beside gguflm's figures."""
    require_peer()
    assert bench_main(["kernels", "--quick", "--types", "Q4_0,IQ2_XXS", "--shapes", "64x256", "--compare",
                       "llama-cpp"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert any("llama.cpp GB/s" in line for line in printed)
    rows = [line.split() for line in printed if "64x256" in line]
    # (the figures of so small a matrix on a busy machine may print as 0.0: their values are below)
    assert [r[0] for r in rows] == ["Q4_0", "IQ2_XXS"] and all(float(r[-1]) >= 0 and float(r[-2]) >= 0 for r in rows)
    result = kernels.run(types=["Q4_0"], shapes=[(64, 256)], threads=[1], batch=4, membw_bytes=1 << 16, repeat=1,
                         compare=True, out=lambda line: None)
    (row,) = result["rows"]
    assert row["ggml_gbs"] > 0 and row["ggml_gflops"] > 0


def test_ggml_peer_graph_refuses_computes_beyond_its_buffers():
    """ggml aborts the process when a compute's work buffer does not fit its context; the graph
    raises before that instead."""
    require_peer()
    fmt = q.get("Q8_0")
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    w = fmt.quantize(np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)).reshape(8, -1)
    with ggml_peer.mul_mat_graph(int(fmt.type), w, 64, x, nodes=2, computes=2) as (compute, result):
        compute()
        compute()
        with pytest.raises(RuntimeError, match="made for 2 computes"):
            compute()
        with same_arithmetic():
            assert np.array_equal(result(), q.matmul(w, fmt.type, x))
