# The nogil C API of the gated delta-net (delta_net.h), shared by the delta_net and plan extensions:
#     from delta_net_kernels cimport gguflm_gdn_args, gguflm_gated_delta_net
# arith (GGUFLM_ARITH_*) comes from the one switch (dispatch.pxd).
from libc.stdint cimport int64_t

cdef extern from "delta_net.h" nogil:
    ctypedef struct gguflm_gdn_args:
        float *s
        const int64_t *cells
        int64_t n_tokens, d, n_head_k, n_head_v
        const float *q
        const float *k
        int64_t q_stride, k_stride
        const float *v
        int64_t v_stride
        const float *g
        const float *beta
        int64_t g_stride, beta_stride
        float *out
        int64_t out_stride
    void gguflm_gated_delta_net(const gguflm_gdn_args *a, int isa, int arith, int n_threads)
    void gguflm_gdn_gates(int64_t n_rows, int64_t n_head, float *alpha, int64_t alpha_stride, const float *dt_b,
                          const float *A, float *beta, int64_t beta_stride)
    void gguflm_sigmoid_mul(int64_t n_rows, int64_t n, float *x, int64_t x_stride, const float *gate,
                            int64_t gate_stride, int64_t gate_step)
