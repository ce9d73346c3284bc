# The nogil C API of the forward-pass kernels (ops.h), shared by the ops and plan extensions:
#     from ops_kernels cimport gguflm_attn_args, gguflm_attention, ...
# Like the quant kernels they are static functions in headers: each extension has its own copy.
# arith (GGUFLM_ARITH_*) and use_avx2 (ISA >= avx2), or for gguflm_attention the ISA itself
# (GGUFLM_ISA_*), come from the one switch (dispatch.pxd).
from libc.stdint cimport int32_t, int64_t, uint16_t, uint64_t

cdef extern from "ggml_blocks.h" nogil:
    ctypedef uint16_t ggml_half

cdef extern from "ops.h" nogil:
    void gguflm_gelu_table_init(ggml_half *table)
    ctypedef struct gguflm_rope_params:
        int n_dims
        int neox
        float freq_base, freq_scale, ext_factor, attn_factor
        float corr_low, corr_high
        const float *freq_factors
    void gguflm_rope_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast,
                               float beta_slow, float *low, float *high)
    void gguflm_hadamard_rows(int64_t n_rows, int64_t n, int chunk, float *x, int64_t x_stride, int n_threads)
    void gguflm_rms_norm_rows(int64_t n_rows, int n, const float *x, int64_t x_stride, const float *w,
                              float eps, float *out, int64_t out_stride, int n_threads)
    int gguflm_rope_apply(const gguflm_rope_params *p, const int32_t *pos, int64_t n_rows, int n_heads,
                          int head_dim, float *x, int64_t x_stride, int n_threads)
    void gguflm_layer_norm_rows(int64_t n_rows, int n, const float *x, int64_t x_stride, const float *w,
                                const float *b, float eps, float *out, int64_t out_stride, int arith, int use_avx2,
                                int n_threads)
    enum:
        GGUFLM_UNARY_GELU
        GGUFLM_UNARY_TANH
    void gguflm_unary_rows(int kind, const ggml_half *gelu_table, int64_t n_rows, int n, const float *x,
                           int64_t x_stride, float *out, int64_t out_stride, int use_avx2, int n_threads)
    int gguflm_pool_mean(int n_tok, int n, int n_seqs, const float *x, int64_t x_stride, const float *m,
                         float *out, int64_t out_stride, int arith, int use_avx2, int n_threads)
    enum:
        GGUFLM_GLU_SWIGLU
        GGUFLM_GLU_GEGLU
    void gguflm_glu_rows(int kind, const ggml_half *gelu_table, int64_t n_rows, int n, const float *gate,
                         int64_t gate_stride, const float *up, int64_t up_stride, float *out,
                         int64_t out_stride, int arith, int use_avx2, int n_threads)
    ctypedef struct gguflm_attn_args:
        const float *q
        int64_t q_stride
        int n_tok, n_head, n_head_kv, head_dim_k, head_dim_v
        const void *k
        const void *v
        int cache_type_k, cache_type_v
        int64_t k_row_bytes, v_row_bytes
        int n_kv
        const int32_t *cell_pos
        const uint64_t *cell_seq
        const int32_t *tok_pos
        const int32_t *tok_seq
        int causal
        int32_t n_swa
        float kq_scale
        float softcap
        float *out
        int64_t out_stride
        int arith
        const int32_t *cell_seq_id
        int n_cols
        float max_bias
        const float *sinks
        int per_stream
        int per_token
        uint64_t batched_seqs
        int swa_symmetric
        const float *rel_bias
        int rel_buckets
        int rel_bidirectional
        int swa_chunked
    int gguflm_attention(const gguflm_attn_args *a, int isa, int n_threads)

