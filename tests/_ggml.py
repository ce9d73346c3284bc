"""ggml-cpu itself (the libraries llama-cpp-python ships) as a test oracle, when installed.

``vec_dot`` calls the library's own ``ggml_vec_dot_*`` through its CPU type traits; ``mul_mat``
builds a one-node ggml graph (gguflm.bench.ggml_peer) and computes it on the CPU backend, so the weight goes through the
same kernels llama.cpp picks for a model weight of that shape: llamafile's sgemm, the tiled GEMM,
the vec_dot chunks, or (rows % 8 == 0, Q4_0/Q4_K/IQ4_NL/MXFP4) the CPU_REPACK buffer and its GEMV/GEMM.
Tests that need it skip when ``llama_cpp`` is not importable: it is a reference peer, not a
dependency.

The library rounds float dots as the x86 build it is (:func:`arithmetic`); tests compare gguflm
with it inside :func:`same_arithmetic`. A build with AVX512_FP16 needs nothing more: in this
ggml, F16 dots accumulate in fp32 there too (``GGML_F16_DOT_*``), and only
``ggml_vec_mad_f16``/``ggml_vec_scale_f16`` (flash attention, which llama.cpp runs only when
asked and gguflm does not reproduce) compute in half precision.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from typing import Iterator

import numpy as np

from _llama import require_peer
from gguflm import system
from gguflm._ext import system as _system
from gguflm.bench import ggml_peer


def _libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    require_peer()  # installed, and a build that computes here (one that dies is no oracle)
    return ggml_peer.libraries()


_ToFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)
_FromFloat = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_int64)
_VecDot = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def require_ggml() -> None:
    """Skip unless a local ggml-cpu that computes on this machine is installed."""
    _libs()


# CPUID bits the build's own ggml_cpu_has_* may lack: CPUID.(7,0):EBX 16 (AVX512F) and
# CPUID.(7,1):EAX 5 (AVX512_BF16)
_BUILD_FEATURES = {"ggml_cpu_has_avx512": ("ebx7", 1 << 16), "ggml_cpu_has_avx512_bf16": ("eax7_1", 1 << 5)}


@functools.cache
def arithmetic() -> str:
    """The gguflm arithmetic of the local ggml-cpu: gguflm's native decision for this CPU (whose
    vendor set GCC's tuning, -march=native) without the instruction sets the library says it was
    not compiled for. The CPU as it is: a GGUFLM_CPU profile does not change how the library was
    built."""
    _, cpu = _libs()
    words = _system.read_cpu_words()
    for function, (word, bit) in _BUILD_FEATURES.items():
        if not getattr(cpu, function)():
            words[word] &= ~bit
    return _system.decide_features(words)["native_arithmetic"]


@contextlib.contextmanager
def same_arithmetic() -> Iterator[str]:
    """gguflm rounding as the local ggml-cpu does (a block that compares the two)."""
    with system.using(arithmetic=arithmetic()):
        yield arithmetic()


def quantize_chunk(t: int, x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """ggml_quantize_chunk of float32 rows x [n, k] (with importance weights imatrix [k]) -> uint8 [n, row bytes]."""
    base, _ = _libs()
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, np.shape(x)[-1])
    tr = base.ggml_get_type_traits(int(t)).contents
    out = np.zeros((x.shape[0], x.shape[1] // tr.blck_size * tr.type_size), dtype=np.uint8)
    qw = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    size = base.ggml_quantize_chunk(int(t), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1],
                                    None if qw is None else qw.ctypes.data)
    assert size == out.nbytes
    return out


def to_float(t: int, blob: np.ndarray, n: int) -> np.ndarray:
    """ggml's to_float (dequantize) of one row of n elements."""
    base, _ = _libs()
    blob = np.ascontiguousarray(blob, dtype=np.uint8)
    out = np.full(n, np.nan, dtype=np.float32)
    _ToFloat(base.ggml_get_type_traits(int(t)).contents.to_float)(
        blob.ctypes.data, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n)
    return out


def from_float(t: int, x: np.ndarray) -> np.ndarray:
    """ggml-cpu's from_float of type t (how it quantizes src1 to a dot partner) of one float32 row."""
    base, cpu = _libs()
    x = np.ascontiguousarray(x, dtype=np.float32)
    tr = base.ggml_get_type_traits(int(t)).contents
    out = np.zeros(x.size // tr.blck_size * tr.type_size, dtype=np.uint8)
    _FromFloat(cpu.ggml_get_type_traits_cpu(int(t)).contents.from_float)(
        x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.ctypes.data, x.size)
    return out


def vec_dot(t: int, w: np.ndarray, xq: np.ndarray, n: int) -> np.float32:
    """ggml-cpu's vec_dot of one weight row with one activation row in the dot partner type."""
    _, cpu = _libs()
    fn = _VecDot(cpu.ggml_get_type_traits_cpu(int(t)).contents.vec_dot)
    w, xq = np.ascontiguousarray(w), np.ascontiguousarray(xq)
    s = ctypes.c_float(np.nan)
    fn(n, ctypes.byref(s), 0, w.ctypes.data, 0, xq.ctypes.data, 0, 1)
    return np.float32(s.value)


def mul_mat(t: int, w: np.ndarray, n_in: int, x: np.ndarray, n_threads: int = 1, repacked: bool = True) -> np.ndarray:
    """ggml_mul_mat(w, x) on the CPU backend: w uint8 [n_rows, row bytes] of type t, x float32
    [n_tok, n_in] -> [n_tok, n_rows]. ``repacked``: hold w where llama.cpp holds a model weight
    (ggml_peer.holds_repacked)."""
    _libs()
    with ggml_peer.mul_mat_graph(t, w, n_in, x, n_threads, repacked) as (compute, result):
        compute()
        return result()


def requires_imatrix(t: int) -> bool:
    """``ggml_quantize_requires_imatrix``."""
    base, _ = _libs()
    return bool(base.ggml_quantize_requires_imatrix(int(t)))
