"""Another Cython module can cimport the kernel API from src/quants_kernels.pxd and call it
without the GIL, on the ISA of the one switch it binds through src/dispatch.pxd: built here into a
temporary folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguflm.quants as q
from gguflm import system

pytestmark = pytest.mark.slow  # minutes: still part of the default run (CI runs it)

ROOT = Path(__file__).resolve().parent.parent

CONSUMER = r'''
from libc.stdint cimport int32_t, int64_t, uint8_t
from dispatch cimport bind_dispatch, gguflm_dispatch
from quants_kernels cimport (gguflm_act_buffer_bytes, gguflm_get_rows, gguflm_matmul_q, gguflm_quantize_act,
                             gguflm_traits)
import numpy as np

cdef const gguflm_dispatch *_switch = bind_dispatch()

def isa():
    return _switch.isa

def project(int wtype, const uint8_t[:, ::1] w, int64_t n_in, const float[:, ::1] x, int n_threads):
    """x quantized once into a caller-owned scratch, then two matmuls share it (as Q, K, V do);
    the output rows are padded, so out_stride differs from n_rows."""
    cdef int vdt = gguflm_traits[wtype].vec_dot_type
    cdef int64_t n_tok = x.shape[0], n_rows = w.shape[0]
    scratch = np.empty(gguflm_act_buffer_bytes(vdt, n_tok, n_in), np.uint8)
    out = np.zeros((2, n_tok, n_rows + 3), np.float32)
    cdef uint8_t[::1] s = scratch
    cdef float[:, :, ::1] o = out
    cdef int isa = _switch.isa, arith = _switch.arith
    with nogil:
        gguflm_quantize_act(vdt, &x[0, 0], n_in, n_tok, n_in, &s[0], isa, n_threads)
        gguflm_matmul_q(wtype, &w[0, 0], w.shape[1], n_rows, n_in, &s[0], n_tok, &o[0, 0, 0], n_rows + 3, 1, isa,
                        arith, n_threads)
        gguflm_matmul_q(wtype, &w[0, 0], w.shape[1], n_rows, n_in, &s[0], n_tok, &o[1, 0, 0], n_rows + 3, 1, isa,
                        arith, n_threads)
    return out[:, :, :n_rows]

def embed(int wtype, const uint8_t[:, ::1] w, int64_t n_in, const int32_t[::1] ids):
    out = np.empty((ids.shape[0], n_in), np.float32)
    cdef float[:, ::1] o = out
    with nogil:
        gguflm_get_rows(wtype, &w[0, 0], w.shape[1], n_in, &ids[0], ids.shape[0], &o[0, 0], n_in, _switch.isa)
    return out
'''

# -O0: the build only has to prove the interface, and it is the slow part of this test
SETUP = r'''
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
ext = Extension("consumer", ["consumer.pyx"], include_dirs=[{src!r}, numpy.get_include()],
                extra_compile_args=["-O0", "-fopenmp", "-Wno-unused-function"], extra_link_args=["-fopenmp"])
setup(ext_modules=cythonize([ext], include_path=[{src!r}], language_level=3, quiet=True))
'''


@pytest.fixture(scope="module")
def consumer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("consumer")
    (folder / "consumer.pyx").write_text(CONSUMER)
    (folder / "setup.py").write_text(SETUP.format(src=str(ROOT / "src")))
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=folder,
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    sys.path.insert(0, str(folder))
    try:
        import consumer as module
    finally:
        sys.path.remove(str(folder))
    return module


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q4_1", "F16"])
def test_cimported_kernels_match_the_python_api(consumer, name):
    assert consumer.isa() == system.ISAS.index(system.current_isa())
    fmt = q.get(name)
    rng = np.random.default_rng(3)
    n_in, n_rows = 512, 45
    w = fmt.quantize(rng.standard_normal((n_rows, n_in)).astype(np.float32))
    w = w.view(np.uint8).reshape(n_rows, -1)
    x = rng.standard_normal((6, n_in)).astype(np.float32)
    both = consumer.project(int(fmt.type), w, n_in, x, 2)
    expected = q.matmul(w, name, x, n_threads=2)
    assert np.array_equal(both[0], expected) and np.array_equal(both[1], expected)
    ids = np.array([44, 0, 7], dtype=np.int32)
    assert np.array_equal(consumer.embed(int(fmt.type), w, n_in, ids), q.get_rows(w, name, ids))


def test_cimporting_module_follows_the_one_switch(consumer):
    """A module outside gguflm reads the switch gguflm.system sets, not a copy of its own."""
    for name in system.supported_isas():
        with system.using(isa=name):
            assert consumer.isa() == system.ISAS.index(name)
