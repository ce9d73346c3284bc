"""Build the Cython extensions under src/ into gguflm._ext.*.

Every ``src/<name>.pyx`` becomes the extension ``gguflm._ext.<name>``; adding a kernel module is
adding a file. OpenMP is used when the compiler accepts ``-fopenmp``; without it the package still
builds and runs single-threaded (``gguflm.system_info()`` says so). No ``-march`` flag is ever
passed: SIMD variants carry GCC ``target`` attributes and are chosen at run time.
"""

import os
import subprocess
import tempfile
import warnings
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SRC = Path("src")

OPENMP_PROBE = r"""
#include <omp.h>
int main(void) {
    int n = 0;
    #pragma omp parallel reduction(+:n)
    n += 1;
    return n > 0 ? 0 : 1;
}
"""


def compiler_accepts_openmp(compiler_cmd: list[str]) -> bool:
    """Compile and link a tiny OpenMP program with the compiler setuptools will use."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(OPENMP_PROBE)
        cmd = [*compiler_cmd, "-fopenmp", src, "-o", os.path.join(tmp, "probe")]
        try:
            return subprocess.run(cmd, capture_output=True).returncode == 0
        except OSError:
            return False


class BuildExt(build_ext):
    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:  # the extensions compile independently: one job per core
            self.parallel = os.cpu_count() or 1

    def build_extensions(self):
        cc = self.compiler.compiler_so[:1] if hasattr(self.compiler, "compiler_so") else ["cc"]
        use_openmp = os.environ.get("GGUFLM_NO_OPENMP") != "1" and compiler_accepts_openmp(cc)
        if not use_openmp:
            warnings.warn("gguflm: building without OpenMP; kernels will run on one thread")
        # a debug build for test runs, e.g. GGUFLM_SANITIZE=address,undefined (then run Python with
        # a sanitizer runtime preloaded: GCC's libasan.so, or atheris' asan_with_fuzzer.so for the
        # fuzz campaigns, docs/reliability.md). Compiled, not linked, with -fsanitize: an
        # extension that named GCC's runtime would load it next to atheris' one, which ASan refuses
        sanitize = os.environ.get("GGUFLM_SANITIZE", "")
        # an interpreter built with -rpath in its LDFLAGS (pyenv, some distributions) passes it on;
        # the extensions need no library from its prefix, and a wheel must not name build paths
        if hasattr(self.compiler, "linker_so"):
            self.compiler.linker_so = [a for a in self.compiler.linker_so if not a.startswith("-Wl,-rpath")]
        for ext in self.extensions:
            # -g0: debug info would record the build directory (profilers need only the symbol
            # table, which stays). No fused multiply-adds the source does not ask for: every ISA
            # variant of a kernel rounds the same way (kernels call fmaf() where ggml fuses). FP
            # exception flags are not observed, so branch-free selects may be vectorized.
            ext.extra_compile_args = ["-O3", "-g0", "-ffp-contract=off", "-fno-trapping-math",
                                      "-Wno-unused-function", "-Wno-unknown-pragmas"]
            ext.extra_link_args = []
            if use_openmp:
                ext.extra_compile_args.append("-fopenmp")
                ext.extra_link_args.append("-fopenmp")
            if sanitize:
                ext.extra_compile_args += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer"]
        super().build_extensions()


def extensions() -> list[Extension]:
    exts = [
        Extension(
            f"gguflm._ext.{pyx.stem}",
            [str(pyx)],
            depends=[str(h) for pattern in ("*.h", "*.inc", "*.pxd") for h in sorted(SRC.glob(pattern))],
            include_dirs=[str(SRC), numpy.get_include()],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        )
        for pyx in sorted(SRC.glob("*.pyx"))
    ]
    return cythonize(
        exts,
        language_level=3,
        include_path=[str(SRC)],
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
            "embedsignature": True,
        },
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
