"""The grid i-quants' VBMI kernels (src/quants_iq_vbmi.inc: AVX512_VBMI, GFNI, AVX512_BITALG) and
their switch.

With them the AVX-512 kernels look the grid entries up by byte permutes instead of scalar loads,
map value numbers and sign fields by bit matrices and gather sign masks by bit shuffles;
the integers, and so the floats, must not change: on every grid type, every path (single tokens,
token tiles, tiled batches) gives the same bits with VBMI on and off, and as the scalar kernels.
Machines without VBMI check the same kernels through SIMDe (test_quants_simd_emulated.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gguflm.quants as q
from gguflm import system
from gguflm._ext import system as ext
from gguflm.ggml_types import GGMLType
from gguflm.testing import strategies as gst

GRID_TYPES = [GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS, GGMLType.IQ3_S,
              GGMLType.IQ1_S, GGMLType.IQ1_M]
HAS_VBMI = ext.cpu_features()["vbmi"]
needs_vbmi = pytest.mark.skipif(not HAS_VBMI, reason="this CPU lacks AVX512_VBMI, GFNI or AVX512_BITALG (AVX-512 state): "
                                "test_quants_simd_emulated runs these kernels through SIMDe")


@needs_vbmi
@pytest.mark.parametrize("t", GRID_TYPES, ids=lambda t: t.name)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_vbmi_kernels_equal_the_others(t, data):
    fmt = q.get(t)
    n_rows, n_in, n_tok = data.draw(gst.matmul_shapes(fmt, max_rows=12, max_blocks=3, n_tok=st.sampled_from([1, 2, 5, 19])))
    w = data.draw(gst.quantized_blocks(fmt, n_rows * n_in // fmt.block_size)).reshape(n_rows, -1)
    x = data.draw(gst.float_rows(n_in, n_tok))
    xq = q.quantize_rows_for_dot(t, x)
    outs = {}
    for isa, vbmi in (("avx512", True), ("avx512", False), ("scalar", False), ("avx512bf16", True)):
        if isa in system.supported_isas():
            with system.using(isa=isa, vbmi=vbmi):
                outs[isa, vbmi] = (q.matmul_quantized(w, t, xq), np.float32(q._k.vec_dot(int(t), w[0], xq[0], n_in)))
    expected = outs["scalar", False]
    for key, (out, dot) in outs.items():
        assert np.array_equal(out.view(np.uint32), expected[0].view(np.uint32)), key
        assert dot.view(np.uint32) == expected[1].view(np.uint32), key


def test_decision_reads_cpuid_7_ecx_bits_1_8_12():
    """The VBMI kernels need AVX512_VBMI, GFNI and AVX512_BITALG (CPUID.(7,0):ECX bits 1, 8, 12),
    usable with the AVX-512 register state, and run where the AVX-512 ISA does too."""
    osxsave_avx = (1 << 27) | (1 << 28) | (1 << 12) | (1 << 29)
    avx512 = (1 << 5) | (1 << 16) | (1 << 17) | (1 << 30) | (1 << 31)
    vnni, vbmi, gfni, bitalg = 1 << 11, 1 << 1, 1 << 8, 1 << 12
    base = {"max_leaf": 0xD, "vendor": "AuthenticAMD", "ecx1": osxsave_avx, "ebx7": avx512, "ecx7": vnni,
            "edx7": 0, "eax7_1": 0, "xcr0": 0xE7}
    the_set = vbmi | gfni | bitalg
    for ecx7, xcr0, ebx7, runs in ((vnni | the_set, 0xE7, avx512, True), (vnni, 0xE7, avx512, False),
                                   (vnni | vbmi, 0xE7, avx512, False),          # VBMI alone (Cannon Lake)
                                   (vnni | vbmi | gfni, 0xE7, avx512, False),   # no BITALG
                                   (vnni | vbmi | bitalg, 0xE7, avx512, False), # no GFNI
                                   (vnni | the_set, 0x7, avx512, False),        # OS without AVX-512 state
                                   (the_set, 0xE7, avx512, False),              # no VNNI: no AVX-512 ISA
                                   (vnni | the_set, 0xE7, 1 << 5, False)):      # without AVX512F
        decided = ext.decide_features(dict(base, ecx7=ecx7, xcr0=xcr0, ebx7=ebx7))
        for name, bit in (("avx512vbmi", vbmi), ("gfni", gfni), ("avx512_bitalg", bitalg)):
            assert decided["cpu"][name] == bool(ecx7 & bit)
            assert decided["usable"][name] == bool(ecx7 & bit and xcr0 == 0xE7)
        assert decided["vbmi"] == runs, (ecx7, xcr0, ebx7)


def test_set_vbmi_checks_the_machine():
    previous = system.vbmi()
    try:
        assert system.set_vbmi(False) == previous and system.vbmi() is False
        assert system.system_info()["vbmi"] is False
        with pytest.raises(ValueError, match="0, 1, on or off"):
            ext.set_vbmi("maybe")
        words = ext.cpu_words()
        for lacking in (2, 1 << 8 | 1 << 12):   # AVX512_VBMI; GFNI and AVX512_BITALG (CPUID.(7,0):ECX)
            simulated = dict(words, ecx7=words["ecx7"] & ~lacking)
            ext._simulate_machine(simulated)
            with pytest.raises(ValueError, match=re.escape(_vbmi_missing(simulated))):
                system.set_vbmi(True)
        ext._simulate_machine()
        if HAS_VBMI:
            assert system.set_vbmi(True) is False and system.vbmi() is True
    finally:
        ext._simulate_machine()
        system.set_vbmi(previous)


def _vbmi_missing(words: dict) -> str:
    """What the message of set_vbmi(True) names on a machine with CPUID/XCR0 ``words``: every feature
    of the AVX-512 kernels and of the VBMI set it cannot use, each with why."""
    decided = ext.decide_features(words)
    needs = ext.ISA_NEEDS["avx512"] + ("avx512vbmi", "gfni", "avx512_bitalg")
    return ", ".join(f"{f} ({'the OS does not enable it' if decided['cpu'][f] else 'not in this CPU'})"
                     for f in ext.FEATURES if f in needs and not decided["usable"][f])


def _vbmi_in_subprocess(value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GGUFLM_VBMI=value)
    return subprocess.run([sys.executable, "-c", "from gguflm import system; print(system.vbmi())"], env=env,
                          capture_output=True, text=True)


def test_environment_turns_vbmi_off():
    """GGUFLM_VBMI=0 at import runs the other AVX-512 grid kernels on a VBMI machine; a bad value,
    or 1 where the CPU lacks it, fails the import naming the variable."""
    off = _vbmi_in_subprocess("0")
    assert off.returncode == 0 and off.stdout.strip() == "False", off.stderr
    bad = _vbmi_in_subprocess("yes")
    assert bad.returncode != 0 and "GGUFLM_VBMI='yes'" in bad.stderr
    on = _vbmi_in_subprocess("1")
    if HAS_VBMI:
        assert on.returncode == 0 and on.stdout.strip() == "True", on.stderr
    else:
        assert on.returncode != 0 and "GGUFLM_VBMI='1': this machine cannot run the VBMI kernels" in on.stderr
        assert _vbmi_missing(ext.cpu_words()) in on.stderr
