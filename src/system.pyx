"""The machine and the one switch of every kernel (``gguflm._ext.system``; public face:
:mod:`gguflm.system`).

This module owns the only dispatch state (``dispatch.h``): the instruction set (ISA) the kernels
run and the ggml x86 build whose float arithmetic they reproduce. At import it decides what the
CPU and the OS enable (``cpu_features.h``: CPUID and XCR0), starts from the best ISA and from the
arithmetic of llama.cpp's native build for this CPU, then applies ``GGUFLM_ISA`` and
``GGUFLM_ARITH``, the only place those variables are read. The quants, ops, plan and sampling
extensions hold a read-only pointer to the state (``dispatch.pxd``) and read it when a call starts.

Also here: build facts and the first OpenMP loop (proves the Cython -> C -> -fopenmp path).
"""

import os

import numpy as np

from cpython.pycapsule cimport PyCapsule_New
from cython.parallel cimport parallel, prange
from libc.stdint cimport uint32_t, uint64_t
from dispatch cimport (GGUFLM_ARITH_COUNT, GGUFLM_DISPATCH_CAPSULE, GGUFLM_ISA_COUNT, gguflm_arith_names,
                       gguflm_dispatch, gguflm_isa_names)


cdef extern from "omp_compat.h" nogil:
    int GGUFLM_HAVE_OPENMP
    int omp_get_thread_num()
    int omp_get_max_threads()
    int omp_get_num_procs()

cdef extern from "cpu_features.h" nogil:
    const char *GGUFLM_COMPILER
    ctypedef struct gguflm_cpuid_words:
        uint32_t max_leaf, ecx1, ebx7, ecx7, edx7, eax7_1
        uint32_t vendor[3]
        uint64_t xcr0
    ctypedef struct gguflm_cpu_features:
        uint32_t cpu, os, usable
        int vendor
    enum:
        GGUFLM_CPU_FEATURE_COUNT
        GGUFLM_CPU_AMX_TILE
        GGUFLM_CPU_AMX_INT8
        GGUFLM_CPU_VBMI_SET
        GGUFLM_OS_AVX
        GGUFLM_OS_AVX512
        GGUFLM_OS_AMX
    const char *const gguflm_cpu_feature_names[]
    const char *const gguflm_vendor_names[]
    const uint32_t gguflm_isa_needs[]
    gguflm_cpuid_words gguflm_cpu_read()
    gguflm_cpu_features gguflm_cpu_decide(const gguflm_cpuid_words *w)
    gguflm_cpuid_words gguflm_cpu_keep(const gguflm_cpuid_words *w, uint32_t keep)
    int gguflm_isa_runs(const gguflm_cpu_features *f, int isa)
    int gguflm_isa_best(const gguflm_cpu_features *f)
    int gguflm_vbmi_runs(const gguflm_cpu_features *f)
    int gguflm_arith_native(const gguflm_cpu_features *f)
    int gguflm_amx_permitted()
    int gguflm_amx_request()


#: every kernel variant, in increasing order of what it needs
ISAS = tuple(gguflm_isa_names[i].decode() for i in range(GGUFLM_ISA_COUNT))
#: the ggml x86 builds whose float rounding the kernels can reproduce
ARITHMETICS = tuple(gguflm_arith_names[i].decode() for i in range(GGUFLM_ARITH_COUNT))
FEATURES = tuple(gguflm_cpu_feature_names[i].decode() for i in range(GGUFLM_CPU_FEATURE_COUNT))
#: what each kernel variant executes
ISA_NEEDS = {name: tuple(f for i, f in enumerate(FEATURES) if gguflm_isa_needs[k] >> i & 1)
             for k, name in enumerate(ISAS)}
_VBMI_NEEDS = ISA_NEEDS["avx512"] + tuple(f for i, f in enumerate(FEATURES) if GGUFLM_CPU_VBMI_SET >> i & 1)
_AMX_NEEDS = ("amx_tile", "amx_int8")

#: the machines GGUFLM_CPU makes this one look like, by the features their CPUs have (of those
#: this CPU has: a feature cannot be added), to test what a machine with fewer runs and reports
CPU_PROFILES = {
    "avx2": ("avx", "fma", "f16c", "avx2"),                                     # Haswell to Zen 3
    "avx512": ("avx", "fma", "f16c", "avx2", "avx512f", "avx512dq", "avx512bw", "avx512vl",
               "avx512_vnni"),                                                  # Cascade Lake
}
CPU_PROFILES["avx512-vbmi"] = CPU_PROFILES["avx512"] + ("avx512vbmi", "gfni", "avx512_bitalg")  # Ice Lake
CPU_PROFILES["avx512-bf16"] = CPU_PROFILES["avx512-vbmi"] + ("avx512_bf16",)  # Zen 4
CPU_PROFILES["amx"] = FEATURES                                                   # Sapphire Rapids

cdef gguflm_cpuid_words _read = gguflm_cpu_read()   # as CPUID and XGETBV read them here
cdef gguflm_cpuid_words _words = _read               # what the decisions are taken on
cdef gguflm_cpu_features _machine
cdef gguflm_dispatch _state
cdef int _amx_granted = -1  # not asked yet
_profile = None


cdef void _take_machine(const gguflm_cpuid_words *w):
    """Decide on the words w, and start from the best ISA and VBMI where they run (AMX: on once
    granted, _apply_environment), and from the arithmetic of llama.cpp's native build for the CPU
    as it is: a profile does not change how a llama.cpp built here rounds."""
    global _words, _machine
    _words = w[0]
    _machine = gguflm_cpu_decide(&_words)
    cdef gguflm_cpu_features real = gguflm_cpu_decide(&_read)
    _state.isa = gguflm_isa_best(&_machine)
    _state.arith = gguflm_arith_native(&real)
    _state.vbmi = gguflm_vbmi_runs(&_machine)
    _state.amx = 0
    _state.vendor = _machine.vendor


_take_machine(&_words)


cdef uint32_t _bits(features) except? 0:
    cdef uint32_t bits = 0
    for name in features:
        bits |= 1u << FEATURES.index(name)
    return bits


def _use_profile(str name) -> None:
    """Look like a machine of profile ``name`` (CPU_PROFILES) from now on: its features only."""
    global _profile
    if name not in CPU_PROFILES:
        raise ValueError(f"unknown machine profile {name!r}; expected one of {', '.join(CPU_PROFILES)}")
    cdef gguflm_cpuid_words w = gguflm_cpu_keep(&_read, _bits(CPU_PROFILES[name]))
    _take_machine(&w)
    _profile = name


def cpu_profile():
    """The profile GGUFLM_CPU made this machine look like (see CPU_PROFILES), or None."""
    return _profile


def native_arithmetic() -> str:
    """The arithmetic of llama.cpp's native build for this CPU as it is (whatever GGUFLM_CPU says)."""
    cdef gguflm_cpu_features real = gguflm_cpu_decide(&_read)
    return ARITHMETICS[gguflm_arith_native(&real)]


cdef str _missing(needs):
    """Each of the features ``needs`` that this machine cannot use, and why."""
    return ", ".join(f"{f} ({'the OS does not enable it' if _machine.cpu >> i & 1 else 'not in this CPU'})"
                     for i, f in enumerate(FEATURES) if f in needs and not _machine.usable >> i & 1)


cdef dict _flags(uint32_t bits):
    return {name: bool(bits >> i & 1) for i, name in enumerate(FEATURES)}


cdef list _isas(const gguflm_cpu_features *f):
    return [name for i, name in enumerate(ISAS) if gguflm_isa_runs(f, i)]


cdef dict _describe(const gguflm_cpu_features *f):
    return {
        "cpu": _flags(f.cpu),
        "os": {"avx": bool(f.os & GGUFLM_OS_AVX), "avx512": bool(f.os & GGUFLM_OS_AVX512),
               "amx": bool(f.os & GGUFLM_OS_AMX)},
        "usable": _flags(f.usable),
        "isas": _isas(f),
        "vbmi": bool(gguflm_vbmi_runs(f)),
        "vendor": gguflm_vendor_names[f.vendor].decode(),
        "native_arithmetic": ARITHMETICS[gguflm_arith_native(f)],
    }


cdef gguflm_cpuid_words _words_from(dict words) except *:
    cdef gguflm_cpuid_words w
    vendor = words["vendor"].encode("latin-1")
    if len(vendor) != 12:
        raise ValueError(f"a CPUID vendor has 12 characters, got {words['vendor']!r}")
    w.max_leaf, w.ecx1, w.ebx7 = words["max_leaf"], words["ecx1"], words["ebx7"]
    w.ecx7, w.edx7, w.eax7_1, w.xcr0 = words["ecx7"], words["edx7"], words["eax7_1"], words["xcr0"]
    for i in range(3):
        w.vendor[i] = int.from_bytes(vendor[4 * i:4 * i + 4], "little")
    return w


def decide_features(dict words) -> dict:
    """The decision this module takes on a machine with the CPUID and XCR0 ``words`` (the keys of
    :func:`cpu_words`).

    Returns ``cpu`` (feature -> CPUID advertises it), ``os`` (``avx``, ``avx512``, ``amx`` ->
    XCR0 enables that register state; nothing without OSXSAVE), ``usable`` (feature -> both),
    ``isas`` (the kernel variants it runs), ``vbmi`` (it runs the VBMI grid i-quant kernels), ``vendor`` (``intel``, ``amd`` or ``other``) and
    ``native_arithmetic``.
    """
    cdef gguflm_cpuid_words w = _words_from(words)
    cdef gguflm_cpu_features f = gguflm_cpu_decide(&w)
    return _describe(&f)


cdef dict _words_dict(const gguflm_cpuid_words *w):
    vendor = b"".join(int(w.vendor[i]).to_bytes(4, "little") for i in range(3))
    return {"max_leaf": w.max_leaf, "vendor": vendor.decode("latin-1"), "ecx1": w.ecx1, "ebx7": w.ebx7,
            "ecx7": w.ecx7, "edx7": w.edx7, "eax7_1": w.eax7_1, "xcr0": w.xcr0}


def cpu_words() -> dict:
    """This machine's CPUID and XCR0 words, as :func:`decide_features` takes them (as a GGUFLM_CPU
    profile makes them look)."""
    return _words_dict(&_words)


def read_cpu_words() -> dict:
    """The CPUID and XCR0 words as this CPU and OS report them, whatever GGUFLM_CPU says."""
    return _words_dict(&_read)


def cpu_features() -> dict:
    """:func:`decide_features` of this machine."""
    return _describe(&_machine)


def _simulate_machine(dict words=None) -> None:
    """Tests: check ISAs as on a machine with these CPUID/XCR0 words (keys of :func:`cpu_words`);
    None: this machine again. The kernels keep running the ISA in force."""
    global _machine
    cdef gguflm_cpuid_words w = _words if words is None else _words_from(words)
    _machine = gguflm_cpu_decide(&w)


def supported_isas() -> list[str]:
    """The kernel variants this CPU and OS run, best last."""
    return _isas(&_machine)


def current_isa() -> str:
    return ISAS[_state.isa]


def set_isa(str name) -> str:
    """Make every kernel run ``name``'s variant from their next call on; returns the previous one."""
    if name not in ISAS:
        raise ValueError(f"unknown ISA {name!r}; expected one of {', '.join(ISAS)}")
    cdef int isa = ISAS.index(name)
    if not gguflm_isa_runs(&_machine, isa):
        raise ValueError(f"this machine cannot run the {name} kernels: {_missing(ISA_NEEDS[name])}; it runs "
                         f"{', '.join(supported_isas())}")
    previous = current_isa()
    _state.isa = isa
    return previous


cdef bint _switch_value(str name, on) except -1:
    """A switch's setting: a bool, or from the environment "0", "1", "on" or "off"."""
    if isinstance(on, str):
        if on not in ("0", "1", "on", "off"):
            raise ValueError(f"{name} takes 0, 1, on or off, got {on!r}")
        return on in ("1", "on")
    return bool(on)


def vbmi() -> bool:
    """Whether the AVX-512 ISAs' grid i-quant kernels use the VBMI set (AVX512_VBMI, GFNI,
    AVX512_BITALG) now."""
    return bool(_state.vbmi)


def set_vbmi(on) -> bool:
    """Let the AVX-512 ISAs' grid i-quant kernels use the VBMI set (AVX512_VBMI, GFNI, AVX512_BITALG)
    or not from their next call on; returns the previous setting. The same bits either way."""
    on = _switch_value("vbmi", on)
    if on and not gguflm_vbmi_runs(&_machine):
        raise ValueError(f"this machine cannot run the VBMI kernels (the avx512 kernels with avx512vbmi, gfni "
                         f"and avx512_bitalg): {_missing(_VBMI_NEEDS)}")
    previous = vbmi()
    _state.vbmi = 1 if on else 0
    return previous


def current_arithmetic() -> str:
    return ARITHMETICS[_state.arith]


def set_arithmetic(str name) -> str:
    """Reproduce ggml-cpu's ``name`` x86 build's float rounding from the next call on (any ISA
    computes any); returns the previous one."""
    if name not in ARITHMETICS:
        raise ValueError(f"unknown arithmetic {name!r}; expected one of {', '.join(ARITHMETICS)}")
    previous = current_arithmetic()
    _state.arith = ARITHMETICS.index(name)
    return previous


def amx_support() -> dict:
    """AMX tiles: ``cpu`` (CPUID has AMX-TILE and AMX-INT8), ``os`` (XCR0 enables the tile state),
    ``permitted`` (the kernel has granted this process the tile data state)."""
    return {"cpu": bool(_machine.cpu & GGUFLM_CPU_AMX_TILE and _machine.cpu & GGUFLM_CPU_AMX_INT8),
            "os": bool(_machine.os & GGUFLM_OS_AMX), "permitted": bool(gguflm_amx_permitted())}


def request_amx() -> bool:
    """Ask the kernel, once per process, for the tile data state (Linux); True when AMX may run.

    Never asked when the CPU or the OS lacks AMX (nor when ``GGUFLM_AMX=0`` keeps the tiles off
    from import on): a grant makes every signal frame of the process larger.
    """
    global _amx_granted
    state = amx_support()
    if not (state["cpu"] and state["os"]):
        return False
    if _amx_granted < 0:
        _amx_granted = gguflm_amx_request()
    return bool(_amx_granted)


def amx() -> bool:
    """Whether the AVX-512 ISAs' batch kernels that have an AMX variant use the tiles now."""
    return bool(_state.amx)


def set_amx(on) -> bool:
    """Let the AVX-512 ISAs' batch kernels that have an AMX variant use the tiles (or not) from their
    next call on, asking the kernel for the tile state first; returns the previous setting. The same
    bits either way."""
    on = _switch_value("amx", on)
    if on and not request_amx():
        state = amx_support()
        why = _missing(_AMX_NEEDS) if not (state["cpu"] and state["os"]) else \
            "the kernel did not grant the tile data state"
        raise ValueError(f"this machine cannot run the AMX kernels: {why}")
    previous = amx()
    _state.amx = 1 if on else 0
    return previous


def build_info() -> dict:
    """Compiler and OpenMP facts fixed when the extension was built."""
    return {
        "compiler": GGUFLM_COMPILER.decode(),
        "openmp": bool(GGUFLM_HAVE_OPENMP),
        "omp_max_threads": omp_get_max_threads(),
        "omp_num_procs": omp_get_num_procs(),
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


def _apply_environment() -> None:
    for variable, setter in (("GGUFLM_CPU", _use_profile), ("GGUFLM_ISA", set_isa),
                             ("GGUFLM_ARITH", set_arithmetic), ("GGUFLM_VBMI", set_vbmi), ("GGUFLM_AMX", set_amx)):
        value = os.environ.get(variable, "").strip().lower()
        if value:
            try:
                setter(value)
            except ValueError as e:
                raise ImportError(f"{variable}={value!r}: {e}") from None
    # the tiles are on by default where they run: the kernel is asked for them here, once
    if not os.environ.get("GGUFLM_AMX", "").strip():
        _state.amx = 1 if request_amx() else 0


_apply_environment()
# published last: a module that binds it sees the environment applied
_dispatch = PyCapsule_New(<void *>&_state, GGUFLM_DISPATCH_CAPSULE, NULL)
