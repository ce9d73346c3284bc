"""The machine gguflm runs on, and the one switch of every kernel.

Two settings decide how the kernels compute, and this module is the only place that sets them:

* the **ISA**, the instruction set the kernels run (:data:`ISAS`: ``scalar``, ``avx2``,
  ``avx512``, ``avx512bf16``: AVX-512 with ``vdpbf16ps`` itself for BF16 dots, which the others
  emulate). Every variant gives the same bits; the default is the best one the CPU has and the
  OS enables (CPUID and XCR0, not merely what the CPU advertises). ``GGUFLM_ISA`` overrides it.
* the **arithmetic**, the x86 build of ggml-cpu whose float rounding (vector sums, exp, float
  weights' dots) is reproduced, as GCC compiles it natively for a family of CPUs
  (:data:`ARITHMETICS`: ``avx2``; ``avx512``, AVX-512 without AVX512_BF16; ``avx512bf16``, with
  it, tuned for Intel; ``zen4``, with it, tuned for AMD, whose auto-vectorized loops are 512 bits
  wide). Any ISA computes any; the default is the build llama.cpp compiles natively for this CPU
  (its features and its vendor). ``GGUFLM_ARITH`` overrides it.

Two more switches pick no ISA of their own but a faster way to the same bits: **VBMI**, whether
the AVX-512 ISAs' grid i-quant kernels (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) use AVX512_VBMI's
byte permutes for their grid lookups, on by default where the CPU has AVX512_VBMI and the OS
enables AVX-512 (on Intel's cores only IQ2_XXS, IQ3_XXS and IQ3_S take them: the AVX-512 kernels,
which gather the grid entries, run the others as fast or faster there); and **AMX**, whether the AVX-512 ISAs' batch kernels of the repacked Q4_0 recipe
(Q4_0, IQ4_NL, MXFP4) and the TILED K GEMM of the types of 32-element sub-blocks (Q4_K, Q5_K, IQ4_XS,
IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S) take their integer dots from Intel's AMX tiles, on by default where the CPU
has AMX-INT8, the OS enables the tile state and the kernel grants it to the process (asked once,
at import). ``GGUFLM_VBMI=0`` and ``GGUFLM_AMX=0`` (or :func:`set_vbmi`, :func:`set_amx`) turn
them off, e.g. to test the other AVX-512 kernels on such a machine.

For tests of what other machines run and report, ``GGUFLM_CPU`` makes this one look like a
machine of one of :data:`CPU_PROFILES` (``avx2``: AVX2-only; ``avx512``: AVX-512 with VNNI, without
VBMI or GFNI; ``avx512-vbmi``: with them; ``avx512-bf16``: also AVX512_BF16; ``amx``: everything):
the features the profile's CPUs lack count as absent everywhere (decisions, defaults, reports,
error messages). It cannot add a feature this CPU lacks, and it leaves the default arithmetic that
of llama.cpp's native build on the CPU as it is (a profile does not rebuild a local llama.cpp;
``GGUFLM_ARITH`` reproduces another machine's).

The environment variables (``GGUFLM_CPU``, ``GGUFLM_ISA``, ``GGUFLM_ARITH``, ``GGUFLM_VBMI``,
``GGUFLM_AMX``) are read once, when gguflm is first imported; an unknown value, or an ISA
this machine cannot run, makes that import fail with a message naming the variable. After that,
:func:`set_isa` and :func:`set_arithmetic` change what every kernel runs from its next call on: the
quantized matmuls (:mod:`gguflm.quants`), the forward-pass ops, the sampler scans, and the recorded
forward passes contexts replay. A recorded pass reads both settings when it starts and keeps them to
its last node, so a switch never mixes ISAs or arithmetics within one forward pass; existing
contexts follow it from their next pass on.
"""

from __future__ import annotations

import contextlib
import os
import platform
from typing import Any, Iterator

from gguflm._ext import system as _system
from gguflm.threads import resolve_n_threads, usable_cores

#: every kernel variant, in increasing order of what it needs
ISAS: tuple[str, ...] = _system.ISAS
#: the ggml-cpu x86 builds whose float rounding the kernels reproduce
ARITHMETICS: tuple[str, ...] = _system.ARITHMETICS
#: GGUFLM_CPU's machine profiles: name -> the features its CPUs have
CPU_PROFILES: dict[str, tuple[str, ...]] = _system.CPU_PROFILES


def supported_isas() -> list[str]:
    """The ISAs this CPU and OS run, best last (``scalar`` always)."""
    return _system.supported_isas()


def current_isa() -> str:
    """The ISA every kernel runs now."""
    return _system.current_isa()


def set_isa(name: str) -> str:
    """Make every kernel run ``name`` from its next call on; returns the previous ISA.

    Raises
    ------
    ValueError
        ``name`` is not one of :data:`ISAS`, or this machine cannot run it (the message says which
        feature the CPU lacks or the OS does not enable).
    """
    return _system.set_isa(name)


def current_arithmetic() -> str:
    """The ggml build whose float rounding the kernels reproduce now."""
    return _system.current_arithmetic()


def set_arithmetic(name: str) -> str:
    """Reproduce ggml-cpu's ``name`` build (one of :data:`ARITHMETICS`) from the next call on,
    whichever ISA runs; returns the previous arithmetic.

    Raises
    ------
    ValueError
        ``name`` is not one of :data:`ARITHMETICS`.
    """
    return _system.set_arithmetic(name)


def vbmi() -> bool:
    """Whether the AVX-512 ISAs' grid i-quant kernels use the VBMI set (AVX512_VBMI, GFNI,
    AVX512_BITALG) now."""
    return _system.vbmi()


def set_vbmi(on: bool) -> bool:
    """Let the AVX-512 ISAs' grid i-quant kernels use the VBMI set (AVX512_VBMI, GFNI and
    AVX512_BITALG: byte permutes, bit-matrix maps and bit gathers) (True) or not (False) from their
    next call on; returns the previous setting. Both give the same bits.

    Raises
    ------
    ValueError
        ``on`` is true and this machine cannot run the three.
    """
    return _system.set_vbmi(bool(on))


def amx() -> bool:
    """Whether the AVX-512 ISAs' batch kernels that have an AMX variant use the tiles now."""
    return _system.amx()


def set_amx(on: bool) -> bool:
    """Let the AVX-512 ISAs' batch kernels that have an AMX variant use the tiles (True) or not
    (False) from their next call on; returns the previous setting. Both give the same bits.

    Raises
    ------
    ValueError
        ``on`` is true and this machine cannot run AMX-INT8 (the CPU lacks it, the OS does not
        enable the tile state, or the kernel refused it).
    """
    return _system.set_amx(bool(on))


@contextlib.contextmanager
def using(isa: str | None = None, arithmetic: str | None = None, vbmi: bool | None = None,
          amx: bool | None = None) -> Iterator[None]:
    """Run a block with another ISA, arithmetic, VBMI and/or AMX setting, then restore the previous
    ones."""
    with contextlib.ExitStack() as restore:
        if isa is not None:
            restore.callback(set_isa, set_isa(isa))
        if arithmetic is not None:
            restore.callback(set_arithmetic, set_arithmetic(arithmetic))
        if vbmi is not None:
            restore.callback(set_vbmi, set_vbmi(vbmi))
        if amx is not None:
            restore.callback(set_amx, set_amx(amx))
        yield


def system_info() -> dict[str, Any]:
    """Describe the build, the CPU and what runs, as llama.cpp's ``llama_print_system_info`` does.

    Keys: ``compiler``, ``openmp``, ``omp_max_threads``, ``omp_num_procs``, ``usable_cores``,
    ``default_threads``, ``machine``; ``isa``, ``arithmetic`` and ``vbmi`` (in force now),
    ``supported_isas``, ``native_arithmetic`` (llama.cpp's native build for this CPU),
    ``cpu_vendor`` (``intel``, ``amd`` or ``other``: GCC tunes native builds by it);
    ``cpu_features`` (feature -> the CPU has it and the OS enables it: what may run),
    ``cpu_advertises`` (feature -> CPUID has it), ``os_enables`` (``avx``, ``avx512``, ``amx``
    register states in XCR0), ``amx`` (``cpu``, ``os``, ``permitted``: whether the kernel has
    granted this process the tile data state; ``on``: whether the kernels use the tiles now) and
    ``cpu_profile`` (the ``GGUFLM_CPU`` machine profile this one is made to look like, or None).
    """
    features = _system.cpu_features()
    info: dict[str, Any] = dict(_system.build_info())
    info["usable_cores"] = usable_cores()
    info["default_threads"] = resolve_n_threads(None)
    info["machine"] = platform.machine()
    info["isa"] = current_isa()
    info["arithmetic"] = current_arithmetic()
    info["vbmi"] = vbmi()
    info["supported_isas"] = features["isas"]
    info["native_arithmetic"] = _system.native_arithmetic()
    info["cpu_vendor"] = features["vendor"]
    info["cpu_features"] = features["usable"]
    info["cpu_advertises"] = features["cpu"]
    info["os_enables"] = features["os"]
    info["amx"] = dict(_system.amx_support(), on=amx())
    info["cpu_profile"] = _system.cpu_profile()
    return info


def guard_mode() -> bool:
    """Whether forward passes recorded from now on run in guard mode (see :func:`set_guard_mode`)."""
    return _guard


def set_guard_mode(enabled: bool) -> bool:
    """Debug switch (default: ``GGUFLM_GUARD=1`` at import): forward passes recorded afterwards
    put guard zones around every activation buffer, fill them with a canary byte and check them
    after every step, raising :class:`gguflm.errors.BufferOverrunError` when a kernel wrote
    outside its buffers. Slower; meant for test runs (``GGUFLM_GUARD=1 python -m pytest tests``).
    Returns the previous setting."""
    global _guard
    previous, _guard = _guard, bool(enabled)
    return previous


_guard = os.environ.get("GGUFLM_GUARD", "") == "1"
