"""ggml-cpu itself, from the libraries llama-cpp-python ships, for side-by-side kernel figures.

:func:`libraries` binds ``libggml-base`` and ``libggml-cpu`` through ctypes; :func:`mul_mat_graph`
builds a ggml graph of ``ggml_mul_mat`` nodes on the CPU backend with the weight held where
llama.cpp holds a model weight (its CPU_REPACK buffer for the types and shapes it repacks), so the
weight goes through the kernels llama.cpp picks for it. ``gguflm bench kernels --compare
llama-cpp`` times it; the tests use it as an oracle (tests/_ggml.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from typing import Callable, Iterator

import numpy as np


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class TraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


class Traits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


_P = ctypes.c_void_p
_LogCallback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_SIGNATURES = [  # (library, function, result, arguments); library 0: ggml-base, 1: ggml-cpu
    (1, "ggml_get_type_traits_cpu", ctypes.POINTER(TraitsCpu), [ctypes.c_int]),
    (1, "ggml_graph_compute_with_ctx", ctypes.c_int, [_P, _P, ctypes.c_int]),
    (1, "_Z35ggml_backend_cpu_repack_buffer_typev", _P, []),
    (1, "ggml_cpu_has_avx512", ctypes.c_int, []),
    (0, "ggml_backend_cpu_buffer_type", _P, []),
    (0, "ggml_init", _P, [InitParams]),
    (0, "ggml_free", None, [_P]),
    (0, "ggml_new_tensor_2d", _P, [_P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
    (0, "ggml_mul_mat", _P, [_P, _P, _P]),
    (0, "ggml_new_graph", _P, [_P]),
    (0, "ggml_build_forward_expand", None, [_P, _P]),
    (0, "ggml_get_data", _P, [_P]),
    (0, "ggml_backend_alloc_ctx_tensors_from_buft", _P, [_P, _P]),
    (0, "ggml_backend_tensor_set", None, [_P, _P, ctypes.c_size_t, ctypes.c_size_t]),
    (0, "ggml_backend_buffer_free", None, [_P]),
    (0, "ggml_log_set", None, [_LogCallback, _P]),
    (0, "ggml_get_type_traits", ctypes.POINTER(Traits), [ctypes.c_int]),
    (0, "ggml_quantize_chunk", ctypes.c_size_t, [ctypes.c_int, _P, _P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _P]),
    (0, "ggml_quantize_requires_imatrix", ctypes.c_bool, [ctypes.c_int]),
]


@functools.cache
def libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """(ggml-base, ggml-cpu) of the installed llama-cpp-python, their functions typed; raises
    ImportError without it."""
    import llama_cpp

    folder = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    libs = (ctypes.CDLL(os.path.join(folder, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL),
            ctypes.CDLL(os.path.join(folder, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL))
    for which, name, res, args in _SIGNATURES:
        fn = getattr(libs[which], name)
        fn.restype, fn.argtypes = res, args
    base, cpu = libs
    cpu.ggml_cpu_init()
    # the repack buffer logs every tensor it repacks; keep the callers' output readable
    libraries.silence = _LogCallback(lambda level, text, user: None)
    base.ggml_log_set(libraries.silence, None)
    return base, cpu


def holds_repacked(t: int, n_rows: int) -> bool:
    """Whether llama.cpp holds a model weight of ggml type t and n_rows rows in its CPU_REPACK
    buffer here: Q4_0, Q4_K, IQ4_NL and MXFP4 with rows % 8 == 0, and Q2_K where the library was
    built with AVX-512."""
    _, cpu = libraries()
    return n_rows % 8 == 0 and (t in (2, 12, 20, 39) or (t == 10 and bool(cpu.ggml_cpu_has_avx512())))


@contextlib.contextmanager
def mul_mat_graph(t: int, w: np.ndarray, n_in: int, x: np.ndarray, n_threads: int = 1, repacked: bool = True,
                  nodes: int = 1, computes: int = 1) -> Iterator[tuple[Callable[[], None], Callable[[], np.ndarray]]]:
    """A graph of ``nodes`` ggml_mul_mat(w, x) on the CPU backend: w uint8 [n_rows, row bytes] of
    type t, x float32 [n_tok, n_in]. Yields (compute, result): compute() runs the graph on
    n_threads threads (one thread start per graph, as llama.cpp's one graph per ubatch), at most
    ``computes`` times (each takes a work buffer from the graph's context, which ggml aborts the
    process on running out of); result() the last node's output [n_tok, n_rows]. ``repacked``:
    hold w as llama.cpp holds a model weight (:func:`holds_repacked`)."""
    base, cpu = libraries()
    w = np.ascontiguousarray(w, dtype=np.uint8)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_rows, n_tok = w.shape[0], x.shape[0]
    # the graph's tensors, then each compute's work buffer (x in the dot partner type: at most
    # half of x's bytes, and a cache line a thread)
    ctx_w = base.ggml_init(InitParams(1 << 16, None, True))
    ctx = base.ggml_init(InitParams((16 << 20) + x.nbytes + nodes * 4 * n_rows * n_tok + computes * (x.nbytes + (1 << 16)),
                                    None, False))
    buf = None
    try:
        tw = base.ggml_new_tensor_2d(ctx_w, int(t), n_in, n_rows)
        repack = repacked and holds_repacked(int(t), n_rows)
        buft = cpu._Z35ggml_backend_cpu_repack_buffer_typev() if repack else base.ggml_backend_cpu_buffer_type()
        buf = base.ggml_backend_alloc_ctx_tensors_from_buft(ctx_w, buft)
        base.ggml_backend_tensor_set(tw, w.ctypes.data, 0, w.nbytes)   # repacks into the buffer's layout
        tx = base.ggml_new_tensor_2d(ctx, 0, n_in, n_tok)
        ctypes.memmove(base.ggml_get_data(tx), x.ctypes.data, x.nbytes)
        graph = base.ggml_new_graph(ctx)
        for _ in range(nodes):
            out = base.ggml_mul_mat(ctx, tw, tx)
            base.ggml_build_forward_expand(graph, out)
        left = [computes]

        def compute() -> None:
            if left[0] == 0:
                raise RuntimeError(f"mul_mat_graph: made for {computes} computes")
            left[0] -= 1
            if cpu.ggml_graph_compute_with_ctx(ctx, graph, n_threads) != 0:
                raise RuntimeError("ggml_graph_compute_with_ctx failed")

        def result() -> np.ndarray:
            data = ctypes.cast(base.ggml_get_data(out), ctypes.POINTER(ctypes.c_float))
            return np.ctypeslib.as_array(data, shape=(n_tok, n_rows)).copy()

        yield compute, result
    finally:
        base.ggml_free(ctx)
        if buf:
            base.ggml_backend_buffer_free(buf)
        base.ggml_free(ctx_w)
