# The one ISA/arithmetic switch of every kernel (dispatch.h), for the Cython modules that call them:
#     from dispatch cimport bind_dispatch, gguflm_dispatch
#     cdef const gguflm_dispatch *_switch = bind_dispatch()    # once, at import
#     ... isa, arith = _switch.isa, _switch.arith               # when a call starts
# gguflm._ext.system owns the only gguflm_dispatch and is the only writer (its setters check what
# the CPU runs); everyone else holds this read-only pointer to it, never a copy.
from cpython.pycapsule cimport PyCapsule_Import

cdef extern from "dispatch.h" nogil:
    enum:
        GGUFLM_ISA_SCALAR
        GGUFLM_ISA_AVX2
        GGUFLM_ISA_AVX512
        GGUFLM_ISA_AVX512BF16
        GGUFLM_ISA_COUNT
        GGUFLM_ARITH_AVX2
        GGUFLM_ARITH_AVX512
        GGUFLM_ARITH_AVX512BF16
        GGUFLM_ARITH_ZEN4
        GGUFLM_ARITH_COUNT
    const char *const gguflm_isa_names[]
    const char *const gguflm_arith_names[]
    ctypedef struct gguflm_dispatch:
        int isa
        int arith
        int vbmi
        int amx
        int vendor
    const char *GGUFLM_DISPATCH_CAPSULE
    const gguflm_dispatch *gguflm_bind_dispatch(const void *d)


cdef inline const gguflm_dispatch *bind_dispatch() except NULL:
    """The switch gguflm._ext.system owns (importing it first, so its environment is read), also
    bound for this extension's C kernel lookups (dispatch.h: gguflm_bound_dispatch)."""
    cdef void *d = PyCapsule_Import(GGUFLM_DISPATCH_CAPSULE, 0)
    if d == NULL:
        return NULL
    return gguflm_bind_dispatch(d)


cdef inline dict dispatch_names(const gguflm_dispatch *d):
    """``{"isa", "arithmetic"}`` of d by name: what a module reports it dispatches to."""
    return {"isa": gguflm_isa_names[d.isa].decode(), "arithmetic": gguflm_arith_names[d.arith].decode()}
