# The nogil C API of the state-space kernels (ssm.h), shared by the ssm and plan extensions:
#     from ssm_kernels cimport gguflm_ssm_args, gguflm_ssm_conv, ...
# isa (GGUFLM_ISA_*) and arith (GGUFLM_ARITH_*) come from the one switch (dispatch.pxd).
from libc.stdint cimport int32_t, int64_t

cdef extern from "ssm.h" nogil:
    ctypedef struct gguflm_ssm_args:
        float *r
        float *s
        const int64_t *cells
        int64_t n_tokens, d_conv, d_inner, d_state
        const float *x
        int64_t x_stride
        const float *conv_w
        const float *conv_b
        int32_t conv_linear
        const float *dt
        int64_t dt_stride
        const float *dt_b
        const float *A
        const float *D
        const float *B
        const float *C
        int64_t bc_stride
        int64_t n_head, n_group
        float *out
        int64_t out_stride
    void gguflm_ssm_conv(const gguflm_ssm_args *a, int isa, int arith, int n_threads)
    void gguflm_ssm_scan(const gguflm_ssm_args *a, int isa, int n_threads)
    void gguflm_ssm_scan_grouped(const gguflm_ssm_args *a, int isa, int arith, int n_threads)
    int gguflm_rs_moves(int32_t *moves, float *r_all, int64_t r_width, float *s_all, int64_t s_width,
                        int64_t n_layer, int64_t size)
