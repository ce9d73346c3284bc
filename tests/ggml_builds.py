"""Each gguflm arithmetic against ggml's float dots compiled by GCC for the CPU family it names.

Not a test: a check to run by hand where a llama.cpp source tree of the peer's version is at hand
(llama-cpp-python 0.3.36's sdist vendors it) and the CPU runs AVX-512 with AVX512_BF16:

    python tests/ggml_builds.py /path/to/llama.cpp

It compiles ggml-cpu's vec.cpp and llamafile/sgemm.cpp as llama.cpp's build does (-O3,
-std=gnu++17) for -march=haswell, skylake-avx512, cooperlake, sapphirerapids (its AVX512_FP16
instructions appear in none of these functions) and native, then compares ggml_vec_dot_f32/f16/
bf16 over row lengths 1..200 and llamafile_sgemm over batches with every arithmetic, printing how
many results differ. Each build must match exactly the arithmetic gguflm names for it (native:
this machine's native_arithmetic), and differ from the others.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import gguflm.quants as q
from gguflm import system
from gguflm._ext import system as _system
from gguflm.ggml_types import GGMLType as T

# stand-ins for the ggml pieces these two files call: a one-thread pool, the fp16 table, asserts
STUB = r"""
#include <stdint.h>
#include <stddef.h>
extern "C" {
struct ggml_threadpool;
static int chunk;
void ggml_threadpool_chunk_set(struct ggml_threadpool *, int value) { chunk = value; }
int ggml_threadpool_chunk_add(struct ggml_threadpool *, int value) { int old = chunk; chunk += value; return old; }
void ggml_barrier(struct ggml_threadpool *) {}
struct ggml_compute_params { int ith, nth; size_t wsize; void *wdata; struct ggml_threadpool *threadpool; bool use_ref; };
bool llamafile_sgemm(const struct ggml_compute_params *, int64_t, int64_t, int64_t, const void *, int64_t,
                     const void *, int64_t, void *, int64_t, int, int, int);
int peer_sgemm(int64_t m, int64_t n, int64_t k, const void *A, const void *B, float *C, int type) {
    struct ggml_compute_params p = {0, 1, 0, 0, 0, false};
    return llamafile_sgemm(&p, m, n, k, A, k, B, k, C, m, type, type, 0);
}
float ggml_table_f32_f16[1 << 16];
void ggml_abort(const char *, int, const char *, ...) { __builtin_trap(); }
void ggml_log_internal(int, const char *, ...) {}
}
"""

BUILDS = {"haswell": "avx2", "skylake-avx512": "avx512", "cooperlake": "avx512bf16", "sapphirerapids": "avx512bf16",
          "native": _system.native_arithmetic()}
DOTS = {T.F32: "ggml_vec_dot_f32", T.F16: "ggml_vec_dot_f16", T.BF16: "ggml_vec_dot_bf16"}


def build(src: Path, march: str, folder: Path) -> ctypes.CDLL:
    ggml = src / "ggml"
    lib, stub = folder / f"libpeer_{march}.so", folder / "stub.cpp"
    stub.write_text(STUB)
    subprocess.run(["g++", "-O3", "-std=gnu++17", f"-march={march}", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16",
                    "-DNDEBUG", "-DGGML_USE_LLAMAFILE", "-D_GNU_SOURCE", f"-I{ggml / 'include'}", f"-I{ggml / 'src'}",
                    f"-I{ggml / 'src' / 'ggml-cpu'}", "-fPIC", "-shared", "-Wl,-Bsymbolic",
                    str(ggml / "src" / "ggml-cpu" / "vec.cpp"), str(ggml / "src" / "ggml-cpu" / "llamafile" / "sgemm.cpp"),
                    str(stub), "-o", str(lib)], check=True)
    peer = ctypes.CDLL(str(lib))
    peer.peer_sgemm.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_int]
    table = np.ctypeslib.as_array((ctypes.c_float * 65536).in_dll(peer, "ggml_table_f32_f16"))
    table[:] = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    for fn in DOTS.values():
        getattr(peer, fn).argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                      ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return peer


def differences(peer: ctypes.CDLL, arith: str) -> tuple[int, int]:
    """(results that differ, results compared) of every dot and accepted tinyBLAS batch"""
    bad = total = 0
    with system.using(arithmetic=arith):
        for t, fn in DOTS.items():
            fmt, rng = q.get(t), np.random.default_rng(int(t))
            for n in range(1, 201):
                w = fmt.quantize((rng.standard_normal((1, n)) * 3).astype(np.float32)).view(np.uint8).reshape(-1)
                x = q.quantize_rows_for_dot(t, (rng.standard_normal((1, n)) * 3).astype(np.float32))[0]
                s = ctypes.c_float()
                getattr(peer, fn)(n, ctypes.byref(s), 0, w.ctypes.data, 0, x.ctypes.data, 0, 1)
                bad += np.float32(s.value).view(np.uint32) != np.float32(q._k.vec_dot(int(t), w, x, n)).view(np.uint32)
                total += 1
            for k in (8, 16, 24, 32, 48, 64, 96, 160, 576):
                for m, n_tok in ((4, 2), (8, 3), (16, 5), (12, 7)):
                    w = fmt.quantize(rng.standard_normal((m, k)).astype(np.float32)).view(np.uint8).reshape(m, -1)
                    x = q.quantize_rows_for_dot(t, rng.standard_normal((n_tok, k)).astype(np.float32))
                    c = np.empty((n_tok, m), np.float32)
                    if peer.peer_sgemm(m, n_tok, k, w.ctypes.data, x.ctypes.data, c.ctypes.data, int(t)):
                        bad += not np.array_equal(c.view(np.uint32), q.matmul_quantized(w, t, x).view(np.uint32))
                        total += 1
    return bad, total


def main(src: Path) -> int:
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        for march, expected in BUILDS.items():
            peer = build(src, march, Path(folder))
            found = {arith: differences(peer, arith) for arith in system.ARITHMETICS}
            print(f"-march={march}: " + ", ".join(f"{a} {b}/{t} differ" for a, (b, t) in found.items()))
            failed |= found[expected][0] != 0 or any(found[a][0] == 0 for a in found if a != expected)
    print("every build matches its arithmetic alone" if not failed else "MISMATCH")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
