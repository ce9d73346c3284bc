# The nogil C API of RWKV's kernels (wkv.h), shared by the wkv and plan extensions:
#     from wkv_kernels cimport gguflm_wkv_args, gguflm_wkv_run, GGUFLM_WKV6, ...
# arith (GGUFLM_ARITH_*) comes from the one switch (dispatch.pxd).
from libc.stdint cimport int32_t, int64_t

cdef extern from "wkv.h" nogil:
    enum:
        GGUFLM_WKV_MAX_IO
        GGUFLM_WKV6
        GGUFLM_WKV7
        GGUFLM_WKV_SHIFT
        GGUFLM_WKV_LERP
        GGUFLM_WKV_DECAY6
        GGUFLM_WKV_DECAY7
        GGUFLM_WKV_SIGMOID
        GGUFLM_WKV_RELU_SQR
        GGUFLM_WKV_SIGMOID_MUL
        GGUFLM_WKV_MUL
        GGUFLM_WKV_VALUE_MIX
        GGUFLM_WKV_KEY_DECAY
        GGUFLM_WKV7_KEYS
        GGUFLM_WKV7_BONUS
        GGUFLM_WKV_GLA
        GGUFLM_WKV_REPEAT
        GGUFLM_WKV_KIND_COUNT
    ctypedef struct gguflm_wkv_args:
        int32_t kind, n_out
        int64_t n_tokens, n, head_size, n_in
        float scale
        float *state
        int64_t state_width, state_offset
        const int64_t *cells
        const float *x[8]
        int64_t x_stride[8]
        const float *p[2]
        float *out[8]
        int64_t out_stride[8]
    void gguflm_wkv_run(const gguflm_wkv_args *a, int arith, int n_threads)
    int gguflm_vec_lanes(int arith)
