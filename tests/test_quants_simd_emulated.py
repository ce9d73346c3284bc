"""The AVX2 and AVX-512 (+VNNI, and +VBMI for the grid i-quants) dot kernels run through SIMDe's
portable intrinsics, in every arithmetic.

CPUs without AVX-512 cannot run the native AVX-512 kernels, so this test compiles the kernel
headers against SIMDe (package cmeel-simde, in the test extra) into a small shared library and
checks every emulated kernel against the scalar one, exactly as test_quants_kernels checks the
native variants. The emulated AVX2 kernels must also equal the native AVX2 ones bit for bit, which
shows that the emulation computes what the hardware computes.
"""

from __future__ import annotations

import ctypes
import shutil
import site
import subprocess
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gguflm.quants as q
from gguflm import system
from gguflm.ggml_types import GGMLType
from gguflm.testing import strategies as gst
from gguflm.testing import random_blocks
import ggml_lanes as lanes
from quants_oracles import KERNEL_TYPES, LANES_TYPES, check_fp16_conversions

pytestmark = pytest.mark.slow  # minutes: still part of the default run (CI runs it)

ROOT = Path(__file__).resolve().parent.parent
# avx512vbmi: avx512, VBMI on; avx2intel: avx2 on an Intel core (the 3-bit grids' gathering kernels)
ISA_IDS = {"scalar": 0, "avx2": 1, "avx512": 2, "avx512vbmi": 3, "avx2intel": 4}


def _simde_include() -> Path:
    bases = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    for base in bases:
        include = Path(base) / "cmeel.prefix" / "include"
        if (include / "simde" / "x86" / "avx512.h").is_file():
            return include
    pytest.fail("SIMDe headers not found: install the test extra (pip install -e '.[test]', cmeel-simde)")


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build the SIMDe harness")
    lib_path = tmp_path_factory.mktemp("simde") / "libgguflm_simde.so"
    cmd = [cc, "-O0", "-shared", "-fPIC", "-fopenmp", "-Wno-unknown-pragmas", "-Wno-psabi", f"-I{ROOT / 'src'}",
           f"-I{_simde_include()}", str(ROOT / "tests" / "simde_harness.c"), "-o", str(lib_path)]
    subprocess.run(cmd, check=True, capture_output=True)
    lib = ctypes.CDLL(str(lib_path))
    lib.gguflm_emulated_dot.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)]
    lib.gguflm_emulated_dot.restype = ctypes.c_int

    lib.gguflm_emulated_matmul.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                           ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                           ctypes.c_void_p, ctypes.c_int]
    lib.gguflm_emulated_picks_special.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.gguflm_emulated_picks_special.restype = ctypes.c_int
    for name in ("gguflm_software_fp32_to_fp16", "gguflm_software_fp16_to_fp32"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def _dot(lib, isa: str, arith: str, t, n: int, w: np.ndarray, xq: np.ndarray) -> np.float32:
    s = ctypes.c_float(np.nan)
    assert lib.gguflm_emulated_dot(ISA_IDS[isa], system.ARITHMETICS.index(arith), int(t), n, w.ctypes.data,
                                   xq.ctypes.data, ctypes.byref(s))
    return np.float32(s.value)


@pytest.mark.parametrize("t", KERNEL_TYPES, ids=lambda t: t.name)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_emulated_simd_kernels_equal_scalar(emulated, t, data):
    def emulated_dot(isa, *args):
        return _dot(emulated, isa, arith, *args)

    fmt, partner = q.get(t), q.get(q.get(t).vec_dot_type)
    arith = data.draw(st.sampled_from(system.ARITHMETICS))
    n = data.draw(st.integers(1, 300)) if fmt.block_size == 1 else max(fmt.block_size, 32) * data.draw(st.integers(1, 6))
    tiny = t == GGMLType.BF16 and data.draw(st.booleans())
    w = data.draw(gst.quantized_blocks(fmt, n // fmt.block_size, tiny=tiny))
    xq = data.draw(gst.quantized_blocks(partner, n // partner.block_size, int8_min=-127, tiny=tiny))
    scalar = emulated_dot("scalar", t, n, w, xq)
    assert scalar.view(np.uint32) == _native("scalar", arith, t, n, w, xq).view(np.uint32)
    # every variant rounds as the scalar kernels; VNNI's vpdpbusd replaces vpmaddubsw+vpmaddwd exactly;
    # the VBMI grid decoding and the gathers give the same bytes
    for isa in ("avx2", "avx512", "avx512vbmi", "avx2intel"):
        assert emulated_dot(isa, t, n, w, xq).view(np.uint32) == scalar.view(np.uint32), isa
    # the CPU's own instructions compute what SIMDe's portable ones do (avx512bf16 has no emulated
    # twin: SIMDe's vdpbf16ps neither reads denormals as zeros nor flushes; it must equal avx512's)
    for isa in set(system.supported_isas()) - {"scalar"}:
        twin = "avx512" if isa == "avx512bf16" else isa
        assert _native(isa, arith, t, n, w, xq).view(np.uint32) == emulated_dot(twin, t, n, w, xq).view(np.uint32), isa


def test_special_kernels_where_they_pay(emulated):
    # every grid type takes its VBMI kernels with vbmi on, but on Intel's cores only those the VBMI
    # kernels look up with few permutes (quants_kernels.h: gguflm_vbmi_pays); vendors 0-2: other,
    # intel, amd (cpu_features.h)
    grid = [GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS, GGMLType.IQ3_S,
            GGMLType.IQ1_S, GGMLType.IQ1_M]
    # and AVX2 takes the 3-bit grids' gathering DOT kernels on Intel's only
    for vendor, name in enumerate(("other", "intel", "amd")):
        picked = {t.name for t in grid if emulated.gguflm_emulated_picks_special(0, vendor, 0, int(t))}
        expected = {"IQ2_XXS", "IQ3_XXS", "IQ3_S"} if name == "intel" else {t.name for t in grid}
        assert picked == expected, name
        gathering = {t.name for t in grid if emulated.gguflm_emulated_picks_special(1, vendor, 0, int(t))}
        assert gathering == ({"IQ3_XXS", "IQ3_S"} if name == "intel" else set()), name
    assert not emulated.gguflm_emulated_picks_special(0, 1, 0, int(GGMLType.Q4_K))   # no VBMI kernel


def _native(isa: str, arith: str, t, n: int, w: np.ndarray, xq: np.ndarray) -> np.float32:
    with system.using(isa=isa, arithmetic=arith):
        return np.float32(q._k.vec_dot(int(t), w, xq, n))


# float weights in every build's arithmetic, over row lengths with and without tails; quantized
# ones (alike in all) in one; the types of the numpy oracle (the others meet ggml's own mul_mat in
# tests/test_quants_lut.py)
MATMUL_CASES = ([pytest.param(t, a, n_in, id=f"{t.name}-{a}-{n_in}") for t in LANES_TYPES if q.get(t).block_size == 1
                 for a in system.ARITHMETICS for n_in in (64, 100)]
                + [pytest.param(t, "avx2", max(q.get(t).block_size, 32) * 2, id=t.name) for t in KERNEL_TYPES
                   if q.get(t).block_size > 1])


@pytest.mark.parametrize("t, arith, n_in", MATMUL_CASES)
def test_emulated_avx512_matmul(emulated, t, arith, n_in):
    """The matmul driver over the emulated AVX2 and AVX-512 kernels, every recipe of llama.cpp
    (single tokens, repacked GEMM groups, tiled and sgemm batches) and two threads included,
    against the numpy oracle of ggml's arithmetic (the value-table and ternary types, which it does
    not re-implement: the native scalar matmul, whose floats every ISA's kernels keep) and the
    native AVX2 matmul."""
    fmt = q.get(t)
    rng = np.random.default_rng(int(t))
    n_rows = 40   # rows % 8 == 0: the repacked and sgemm recipes too
    w = random_blocks(fmt, n_rows * n_in // fmt.block_size, rng).reshape(n_rows, -1)
    for n_tok in (1, 3, 5, 17, 512 if fmt.block_size > 1 else 67):
        xq = q.quantize_rows_for_dot(t, rng.standard_normal((n_tok, n_in)).astype(np.float32))
        outs = {}
        for isa in ("avx2", "avx512", "avx2intel"):
            out = np.full((n_tok, n_rows), np.nan, dtype=np.float32)
            emulated.gguflm_emulated_matmul(ISA_IDS[isa], system.ARITHMETICS.index(arith), int(t), w.ctypes.data,
                                            w.shape[1], n_rows, n_in, xq.ctypes.data, n_tok, out.ctypes.data, 2)
            outs[isa] = out
        if t in LANES_TYPES:
            expected = lanes.matmul_reference(t, w, xq, n_in, arith)
        else:
            with system.using(isa="scalar", arithmetic=arith):
                expected = q.matmul_quantized(w, t, xq)
        for isa in ("avx2", "avx512", "avx2intel"):
            assert np.array_equal(outs[isa].view(np.uint32), expected.view(np.uint32)), (isa, n_tok)
        if "avx2" in system.supported_isas():
            with system.using(isa="avx2", arithmetic=arith):
                assert np.array_equal(q.matmul_quantized(w, t, xq), outs["avx2"])


def test_software_fp16_rows_match_numpy(emulated):
    """The portable fp16 conversions, which builds without F16C use."""
    def to_fp32(halves):
        out = np.empty(halves.shape, np.float32)
        emulated.gguflm_software_fp16_to_fp32(halves.ctypes.data, out.ctypes.data, halves.size)
        return out

    def to_fp16(x):
        x = np.ascontiguousarray(x)
        out = np.empty(x.shape, np.uint16)
        emulated.gguflm_software_fp32_to_fp16(x.ctypes.data, out.ctypes.data, x.size)
        return out

    check_fp16_conversions(to_fp32, to_fp16)
