"""Build facts, CPU features and the first OpenMP loop (proves the Cython → C → -fopenmp path)."""

import numpy as np

from cython.parallel cimport parallel, prange


cdef extern from "omp_compat.h" nogil:
    int GGUFLM_HAVE_OPENMP
    int omp_get_thread_num()
    int omp_get_max_threads()
    int omp_get_num_procs()

cdef extern from "cpu_features.h" nogil:
    const char *GGUFLM_COMPILER
    int gguflm_has_avx2()
    int gguflm_has_f16c()
    int gguflm_has_avx512()
    int gguflm_has_avx512_vnni()


def build_info() -> dict:
    """Compiler and OpenMP facts fixed when the extension was built."""
    return {
        "compiler": GGUFLM_COMPILER.decode(),
        "openmp": bool(GGUFLM_HAVE_OPENMP),
        "omp_max_threads": omp_get_max_threads(),
        "omp_num_procs": omp_get_num_procs(),
    }


def cpu_features() -> dict:
    """What this CPU can run, as the kernels' run-time dispatch sees it."""
    return {
        "avx2": bool(gguflm_has_avx2()),
        "f16c": bool(gguflm_has_f16c()),
        "avx512": bool(gguflm_has_avx512()),
        "avx512_vnni": bool(gguflm_has_avx512_vnni()),
    }


def parallel_sum_squares(const float[::1] x, int n_threads):
    """Sum of squares of ``x`` over ``n_threads`` OpenMP threads.

    Returns ``(total, thread_of_item)``: the float64 total and, for every element, the id of the
    thread that processed it, so a test can see that the work really was shared.
    """
    if n_threads < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    cdef Py_ssize_t n = x.shape[0], i
    cdef double total = 0.0
    thread_of_item = np.empty(n, dtype=np.int32)
    cdef int[::1] owner = thread_of_item
    with nogil, parallel(num_threads=n_threads):
        for i in prange(n, schedule="static"):
            total += <double>x[i] * x[i]
            owner[i] = omp_get_thread_num()
    return total, thread_of_item
