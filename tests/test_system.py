"""The build path (Cython → C → -fopenmp) and system facts."""

import os
import subprocess
import sys

import numpy as np
import pytest

import gguflm
from gguflm._ext import system
from gguflm.threads import resolve_n_threads, usable_cores


def test_prange_sums_and_shares_work():
    x = np.arange(1000, dtype=np.float32) / 7
    total, owners = system.parallel_sum_squares(x, 2)
    assert total == pytest.approx(float(np.sum(x.astype(np.float64) ** 2)), rel=1e-12)
    assert owners.shape == (1000,)
    if system.build_info()["openmp"]:
        # static schedule over 1000 items with 2 threads: both threads took a half
        assert set(np.unique(owners)) == {0, 1}
        assert (owners[:500] == 0).all() and (owners[500:] == 1).all()
    else:
        assert (owners == 0).all()


def test_prange_rejects_zero_threads():
    with pytest.raises(ValueError):
        system.parallel_sum_squares(np.ones(4, dtype=np.float32), 0)


def test_system_info_reports_build_and_cpu():
    info = gguflm.system_info()
    assert info["compiler"]
    assert isinstance(info["openmp"], bool)
    assert info["usable_cores"] >= 1
    feats = info["cpu_features"]
    assert set(feats) == {"avx2", "f16c", "avx512", "avx512_vnni"}
    # AVX-512 VNNI implies AVX-512 implies AVX2 on every CPU that has them
    assert not feats["avx512_vnni"] or feats["avx512"]
    assert not feats["avx512"] or feats["avx2"]
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    assert feats["avx2"] == ("avx2" in flags and "fma" in flags)
    assert feats["avx512_vnni"] == ("avx512_vnni" in flags)


def test_thread_resolution(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert resolve_n_threads(None) == usable_cores()
    assert resolve_n_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert resolve_n_threads(None) == 1
    with pytest.raises(ValueError):
        resolve_n_threads(0)


def test_import_keeps_numpy_blas_to_one_thread():
    """Imported before numpy, gguflm stops a BLAS library from starting threads of its own."""
    probe = ("import os, gguflm, numpy; numpy.ones((64, 64)) @ numpy.ones((64, 64)); "
             "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    blas_threads, n_threads = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                                             text=True, check=True).stdout.split()
    assert blas_threads == "1"
    if sys.platform == "linux":
        assert n_threads == "1"
